#!/usr/bin/env python3
"""MoELayer against plain PyTorch MoE blocks and against `moe bench`, in one run.

For each case of `moe bench`'s registry (shapes read from `moe bench --list`), in f32 and bf16:
  - the plain PyTorch blocks of examples/tiny_mixtral_util.py: `loop` (Mixtral's per-expert loop),
    `sorted` (sort-by-expert, one matmul per group on stacked weights), `sorted_bmm` (groups padded
    to one batched matmul); their weights are leaf tensors in the compute dtype (no per-step cast:
    the strongest plain baseline), the router f32;
  - moe_engine.torch.MoELayer (f32 master weights, cast to the compute dtype each step);
  - `moe bench --case C --dtype Y --json` (bf16: `--weight-dtype f32`, the same f32-master cast)
    as a subprocess, its `fused` variant (the layer's default kernels);
forward, and forward+backward (grad of x and of every weight), medians over --repeats.
Prints a table and the ratios, writes --json.

    PYTHONPATH=build/python /usr/bin/python3 bench/torch_compare.py --json out/torch_compare.json
"""
import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
import tiny_mixtral_util as util  # noqa: E402

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--case", action="append", help="registry case (repeatable; default seed-mixtral and many-experts)")
    p.add_argument("--dtype", action="append", choices=sorted(DTYPES), help="dtypes (default both)")
    p.add_argument("--block", action="append", choices=sorted(util.TORCH_BLOCKS), help="plain blocks (default all)")
    p.add_argument("--repeats", type=int, default=5, help="timed iterations per measurement")
    p.add_argument("--warmup", type=int, default=1, help="untimed iterations first")
    p.add_argument("--threads", type=int, default=0, help="threads of PyTorch and the engine (0: all cores)")
    p.add_argument("--moe", default=os.path.join(HERE, "..", "build", "moe"), help="the moe binary")
    p.add_argument("--no-engine", action="store_true", help="skip MoELayer and moe bench (plain blocks only)")
    p.add_argument("--json", help="write the results here")
    a = p.parse_args(argv)
    a.case = a.case or ["seed-mixtral", "many-experts"]
    a.dtype = a.dtype or ["f32", "bf16"]
    a.block = a.block or ["loop", "sorted", "sorted_bmm"]
    if a.repeats < 1 or a.warmup < 0 or a.threads < 0:
        p.error("--repeats >= 1, --warmup >= 0, --threads >= 0")
    return a


def registry_shapes(moe):
    """{case: (T, D, F, E, K)} from `moe bench --list`."""
    out = subprocess.run([moe, "bench", "--list"], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"torch_compare: {moe} bench --list failed: {out.stderr.strip()}")
    shapes = {}
    for line in out.stdout.splitlines():
        m = re.match(r"\s*(\S+)\s.*?\bT\s*=?\s*(\d+).*?\bD\s*=?\s*(\d+).*?\bF\s*=?\s*(\d+).*?\bE\s*=?\s*(\d+).*?\bK\s*=?\s*(\d+)",
                     line)
        if m:
            shapes[m.group(1)] = tuple(int(g) for g in m.groups()[1:])
    if not shapes:
        raise SystemExit(f"torch_compare: cannot read the case shapes from `{moe} bench --list`:\n{out.stdout}")
    return shapes


def cpu_info():
    model, flags = platform.processor(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and not model:
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    level = "avx512_bf16" if "avx512_bf16" in flags else "avx512" if "avx512f" in flags else \
        "avx2" if "avx2" in flags and "fma" in flags else "other"
    return {"model": model, "level": level, "cores": len(os.sched_getaffinity(0))}


def torch_blas():
    """Which BLAS this process's PyTorch calls: the libraries mapped into the process after a
    matmul, and the GFLOP/s of a 2048^3 f32 matmul."""
    a = torch.randn(2048, 2048)
    a @ a
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            name = os.path.basename(path)
            if re.search(r"(openblas|libblas|mkl|blis|atlas)", name):
                libs.add(os.path.realpath(path))
    times = []
    for _ in range(5):
        t = time.perf_counter()
        a @ a
        times.append(time.perf_counter() - t)
    gf = 2 * 2048 ** 3 / statistics.median(times) / 1e9
    blas = "OpenBLAS" if any("openblas" in p for p in libs) else ("unknown: " + ", ".join(sorted(libs)))
    return {"blas": blas, "libraries": sorted(libs), "f32_matmul_2048_gflops": round(gf, 1)}


def make_weights(T, D, Fd, E, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(T, D, generator=g), "dy": torch.randn(T, D, generator=g),
            "router": torch.randn(D, E, generator=g) * D ** -0.5,
            "wi_0": torch.randn(E, D, Fd, generator=g) * D ** -0.5,
            "wi_1": torch.randn(E, D, Fd, generator=g) * D ** -0.5,
            "wo": torch.randn(E, Fd, D, generator=g) * Fd ** -0.5}


def time_it(fn, reset, warmup, repeats):
    """fn() -> (t_fwd, t_total); reset() runs untimed before each. Returns medians/min/max lists."""
    for _ in range(warmup):
        reset()
        fn()
    fwd, tot = [], []
    for _ in range(repeats):
        reset()
        f, t = fn()
        fwd.append(f)
        tot.append(t)
    return fwd, tot


def step_fn(block, x0, dy):
    """Forward then backward of sum(y * dy) + the aux losses, timed in two parts."""
    def run():
        x = x0.clone().requires_grad_(True)
        t0 = time.perf_counter()
        y, aux = block(x)
        t1 = time.perf_counter()
        torch.autograd.backward([y, aux["load_balance_loss"] + aux["z_loss"]], [dy, torch.ones(())])
        t2 = time.perf_counter()
        return t1 - t0, t2 - t0
    return run


def plain_block(name, w, dtype, K):
    params = {n: (w[n].clone() if n == "router" else w[n].to(dtype)).requires_grad_(True)
              for n in ("router", "wi_0", "wi_1", "wo")}
    fn = util.TORCH_BLOCKS[name]
    cfg = dict(util.ROUTING_DEFAULTS)

    def block(x):
        return fn(x, params["router"], params["wi_0"], params["wi_1"], params["wo"], K, cfg)

    def reset():
        for p in params.values():
            p.grad = None
    return block, reset


def engine_block(moe_engine, w, dtype, shape):
    T, D, Fd, E, K = shape
    layer = moe_engine.torch.MoELayer(num_experts=E, num_experts_per_tok=K, emb_dim=D, moe_mlp_dim=Fd, dtype=dtype)
    with torch.no_grad():
        for n in ("router", "wi_0", "wi_1", "wo"):
            getattr(layer, n).copy_(w[n])

    def reset():
        layer.zero_grad(set_to_none=True)
    return layer, reset


def moe_bench(moe, case, dtype, repeats, warmup, threads):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "bench.json")
        cmd = [moe, "bench", "--case", case, "--dtype", dtype, "--iters", str(repeats), "--warmup", str(warmup),
               "--json", path]
        if dtype == "bf16":
            cmd += ["--weight-dtype", "f32"]
        env = dict(os.environ, MOE_NUM_THREADS=str(threads))
        out = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if out.returncode != 0:
            raise SystemExit(f"torch_compare: {' '.join(cmd)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
        with open(path) as f:
            res = json.load(f)
    rows = {r["pass"]: r for r in res["results"] if r["variant"] == "fused" and r["case"] == case}
    return cmd, res.get("isa"), rows


def main(argv=None):
    a = parse_args(argv)
    threads = a.threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    moe_engine = None
    if not a.no_engine:
        try:
            import moe_engine
            import moe_engine.torch  # noqa: F401
        except ImportError as e:
            raise SystemExit(f"torch_compare: cannot import moe_engine ({e}); build it and run with "
                             "PYTHONPATH=build/python /usr/bin/python3, or pass --no-engine")
        moe_engine.set_num_threads(threads)
    shapes = registry_shapes(a.moe)
    info = {"cpu": cpu_info(), "torch": torch.__version__, "torch_threads": threads,
            "engine_threads": threads if moe_engine else None, **torch_blas()}
    print(f"CPU {info['cpu']['model']} ({info['cpu']['level']}, {info['cpu']['cores']} cores); torch "
          f"{info['torch']} BLAS {info['blas']} (f32 2048^3 matmul {info['f32_matmul_2048_gflops']} GFLOP/s); "
          f"{threads} threads", flush=True)
    results = []

    def record(case, impl, dtype, pass_, times, flops, extra=None):
        med = statistics.median(times) * 1e3
        r = {"case": case, "impl": impl, "dtype": dtype, "pass": pass_, "median_ms": round(med, 3),
             "min_ms": round(min(times) * 1e3, 3), "max_ms": round(max(times) * 1e3, 3),
             "gflops": round(flops / med / 1e6, 2)}
        r.update(extra or {})
        results.append(r)
        print(f"  {case:<13} {impl:<16} {dtype:<5} {pass_:<8} {med:10.1f} ms  {r['gflops']:7.1f} GFLOP/s", flush=True)

    for case in a.case:
        if case not in shapes:
            raise SystemExit(f"torch_compare: case {case!r} not in the registry ({', '.join(sorted(shapes))})")
        T, D, Fd, E, K = shapes[case]
        fwd_flops = 6 * T * K * D * Fd + 2 * T * D * E  # as `moe bench` counts (docs/benchmarks.md)
        print(f"{case}: T={T} D={D} F={Fd} E={E} K={K}", flush=True)
        w = make_weights(T, D, Fd, E)
        for dt in a.dtype:
            dtype = DTYPES[dt]
            x0, dy = w["x"].to(dtype), w["dy"].to(dtype)
            for b in a.block:
                block, reset = plain_block(b, w, dtype, K)
                f, t = time_it(step_fn(block, x0, dy), reset, a.warmup, a.repeats)
                record(case, "torch-" + b, dt, "fwd", f, fwd_flops)
                record(case, "torch-" + b, dt, "fwd+bwd", t, 3 * fwd_flops)
                del block, reset
            if moe_engine:
                layer, reset = engine_block(moe_engine, w, dtype, shapes[case])
                f, t = time_it(step_fn(layer, x0, dy), reset, a.warmup, a.repeats)
                record(case, "MoELayer", dt, "fwd", f, fwd_flops)
                record(case, "MoELayer", dt, "fwd+bwd", t, 3 * fwd_flops)
                del layer, reset
                cmd, isa, rows = moe_bench(a.moe, case, dt, a.repeats, a.warmup, threads)
                for pass_ in ("fwd", "fwd+bwd"):
                    r = rows[pass_]
                    results.append({"case": case, "impl": "moe-bench", "dtype": dt, "pass": pass_,
                                    "median_ms": r["median_ms"], "min_ms": r["min_ms"], "max_ms": r["max_ms"],
                                    "gflops": r["gflops"], "isa": isa, "command": " ".join(cmd)})
                    print(f"  {case:<13} {'moe-bench':<16} {dt:<5} {pass_:<8} {r['median_ms']:10.1f} ms  "
                          f"{r['gflops']:7.1f} GFLOP/s  ({isa})", flush=True)

    ratios = []
    for case in a.case:
        def med(impl, dt, pass_="fwd+bwd"):
            for r in results:
                if r["case"] == case and r["impl"] == impl and r["dtype"] == dt and r["pass"] == pass_:
                    return r["median_ms"]
            return None
        plain = [(med("torch-" + b, dt), "torch-" + b, dt) for b in a.block for dt in a.dtype]
        best_plain = min(p for p in plain if p[0] is not None)
        rec = {"case": case, "best_plain": {"impl": best_plain[1], "dtype": best_plain[2], "median_ms": best_plain[0]}}
        if moe_engine:
            eng = min((med("MoELayer", dt), "MoELayer", dt) for dt in a.dtype)
            rec["best_engine"] = {"dtype": eng[2], "median_ms": eng[0]}
            rec["speedup_vs_best_plain"] = round(best_plain[0] / eng[0], 3)
            rec["binding_overhead"] = {dt: round(med("MoELayer", dt) / med("moe-bench", dt), 3) for dt in a.dtype}
        ratios.append(rec)
    print("\nfwd+bwd ratios:")
    for r in ratios:
        line = (f"  {r['case']}: best plain PyTorch {r['best_plain']['impl']} {r['best_plain']['dtype']} "
                f"{r['best_plain']['median_ms']:.1f} ms")
        if "best_engine" in r:
            line += (f"; best MoELayer {r['best_engine']['dtype']} {r['best_engine']['median_ms']:.1f} ms -> "
                     f"{r['speedup_vs_best_plain']:.2f}x faster; MoELayer / moe bench: "
                     + ", ".join(f"{dt} {v:.3f}" for dt, v in r["binding_overhead"].items()))
        print(line)
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        util.atomic_write_bytes(a.json, [json.dumps({"setup": info, "results": results, "ratios": ratios},
                                                    indent=1).encode() + b"\n"])
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
