#!/usr/bin/env python3
"""MoELayer against the best plain PyTorch MoE blocks and against `moe bench`, and in real use.

Scenarios (--scenario, repeatable; default compare):
  compare     per case and dtype, forward and forward+backward (grad of x and of every weight),
              medians over --repeats, of: the plain PyTorch blocks (bench/torch_blocks.py
              `sorted_fused` = sort-by-expert, `dense` = one gated FFN over the same routed rows;
              examples/tiny_mixtral_util.py `loop`, `sorted`, `sorted_bmm`), MoELayer (f32 master
              weights cast to the dtype each step) and `moe bench --case C --json` (registry
              cases only; bf16 with --weight-dtype f32, the same cast) as a subprocess.
  changing-t  fwd+bwd steps at a fixed T, then --changing-steps steps whose T changes every step
              (uniform in [0.75 T, 1.25 T], seeded, as `moe bench --scenario changing-t`): GFLOP/s of
              each, RSS after, against the fixed-T peak.
  sequence    every --case one after another in this process (MoELayer fwd+bwd), then each case
              in a fresh process (this script, --scenario sequence --child): same / fresh time.
  accumulate  a training-like loop: zero the gradients, 2 micro-batches of fwd+bwd accumulating
              into .grad (MoELayer(accumulate_grads=True)), an SGD update of the weights; against plain
              fwd+bwd steps; MoELayer's peak RSS above the process's before the layer was made,
              against the step's analytic minimum (MoELayer.step_memory_minimum).
Every measurement prints GFLOP/s, the share of system time in the process's CPU time
(getrusage), minor page faults per step and the peak RSS of that measurement (VmHWM, reset
before it through /proc/self/clear_refs where the kernel allows).

Cases: `moe bench`'s registry (shapes from `moe bench --list`) and the public models of MODELS
below (their expert shapes from the published config.json; T chosen to run on 2 cores).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE PYTHONPATH=build/python /usr/bin/python3 \\
        bench/torch_compare.py --json out/torch_compare.json

PyTorch at its best on a CPU also means a caching malloc: with glibc's, every large tensor of the
plain blocks is a fresh mapping faulted in on first touch (30% system time on seed-mixtral, 2.8x
slower; docs/python_benchmarks.md). Preload tcmalloc (Debian: libtcmalloc-minimal4) or jemalloc:
    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 <the command above>
The script prints which malloc the process runs with and warns when it is glibc's.
"""
import argparse
import ctypes
import gc
import json
import os
import platform
import random
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

# PyTorch's OpenMP threads sleep between parallel regions (as in examples/tiny_mixtral.py): spinning
# ones take the cores from the engine's pool that runs next. Read when torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
sys.path.insert(0, HERE)
import tiny_mixtral_util as util  # noqa: E402
import torch_blocks  # noqa: E402

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
SCENARIOS = ("compare", "changing-t", "sequence", "accumulate")
UTIL_BLOCKS = tuple(sorted(util.TORCH_BLOCKS))  # loop, sorted, sorted_bmm
ALL_BLOCKS = tuple(torch_blocks.BLOCKS) + UTIL_BLOCKS

# Public MoE models: the routed experts' shapes (D = hidden_size, F = the expert's intermediate
# size, E = routed experts, K = experts per token) from each model's published config.json, and
# a T that runs on 2 cores. Shared experts, biases and activation variants are not modelled (the
# layer here is the SwiGLU routed block). Names as `moe bench`'s registry spells them.
MODELS = {
    "olmoe-1b-7b": (1024, 2048, 1024, 64, 8,
                    "allenai/OLMoE-1B-7B-0924 config.json: hidden_size 2048, intermediate_size 1024, "
                    "num_experts 64, num_experts_per_tok 8"),
    "qwen1.5-moe-a2.7b": (1024, 2048, 1408, 60, 4,
                          "Qwen/Qwen1.5-MoE-A2.7B config.json: hidden_size 2048, moe_intermediate_size 1408, "
                          "num_experts 60, num_experts_per_tok 4 (plus a shared expert of 5632, not modelled)"),
    "deepseek-v2-lite": (1024, 2048, 1408, 64, 6,
                         "deepseek-ai/DeepSeek-V2-Lite config.json: hidden_size 2048, moe_intermediate_size 1408, "
                         "n_routed_experts 64, num_experts_per_tok 6 (plus 2 shared experts, not modelled)"),
    "gpt-oss-20b": (512, 2880, 2880, 32, 4,
                    "openai/gpt-oss-20b config.json: hidden_size 2880, intermediate_size 2880, "
                    "num_local_experts 32, num_experts_per_tok 4 (its clamped SwiGLU and biases not modelled)"),
    "granite-3.0-3b-a800m": (2048, 1536, 512, 40, 8,
                             "ibm-granite/granite-3.0-3b-a800m config.json: hidden_size 1536, intermediate_size 512, "
                             "num_local_experts 40, num_experts_per_tok 8"),
    "phi-3.5-moe": (512, 4096, 6400, 16, 2,
                    "microsoft/Phi-3.5-MoE-instruct config.json: hidden_size 4096, intermediate_size 6400, "
                    "num_local_experts 16, num_experts_per_tok 2"),
    "mixtral-8x7b": (256, 4096, 14336, 8, 2,
                     "mistralai/Mixtral-8x7B-v0.1 config.json: hidden_size 4096, intermediate_size 14336, "
                     "num_local_experts 8, num_experts_per_tok 2"),
}

TARGETS = {"changing_t_rate": 0.90, "sys_share": 0.05, "rss_growth": 1.15, "same_vs_fresh": 0.10,
           "peak_over_minimum": 1.25}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--scenario", action="append", choices=SCENARIOS + ("all",),
                   help="what to measure (repeatable; default compare)")
    p.add_argument("--case", action="append",
                   help="registry case or public model (repeatable; default seed-mixtral and many-experts); "
                   "--list shows them")
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    p.add_argument("--tokens", type=int, default=0, help="T of every case (0: the case's own)")
    p.add_argument("--dtype", action="append", choices=sorted(DTYPES), help="dtypes (default both; "
                   "changing-t, sequence and accumulate use the first)")
    p.add_argument("--block", action="append", choices=ALL_BLOCKS,
                   help="plain PyTorch blocks (default sorted_fused and dense; changing-t and accumulate use "
                   "the first)")
    p.add_argument("--repeats", type=int, default=5, help="timed iterations per measurement")
    p.add_argument("--warmup", type=int, default=1, help="untimed iterations first")
    p.add_argument("--changing-steps", type=int, default=100, help="changing-t: steps with a new T each")
    p.add_argument("--threads", type=int, default=0, help="threads of PyTorch and the engine (0: all cores)")
    p.add_argument("--moe", default=os.path.join(HERE, "..", "build", "moe"), help="the moe binary")
    p.add_argument("--no-engine", action="store_true", help="skip MoELayer and moe bench (plain blocks only)")
    p.add_argument("--engine-only", action="store_true",
                   help="changing-t and accumulate: MoELayer alone, without the first --block as the reference")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # sequence: one fresh case
    a = p.parse_args(argv)
    a.scenario = list(SCENARIOS) if "all" in (a.scenario or []) else (a.scenario or ["compare"])
    a.case = a.case or ["seed-mixtral", "many-experts"]
    a.dtype = a.dtype or ["f32", "bf16"]
    a.block = a.block or ["sorted_fused", "dense"]
    if a.repeats < 1 or a.warmup < 0 or a.threads < 0 or a.changing_steps < 1 or a.tokens < 0:
        p.error("--repeats >= 1, --warmup >= 0, --threads >= 0, --changing-steps >= 1, --tokens >= 0")
    if a.no_engine and a.engine_only:
        p.error("--no-engine and --engine-only exclude each other")
    if a.no_engine and set(a.scenario) - {"compare"}:
        p.error("--no-engine: only --scenario compare (the others measure MoELayer)")
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


def all_cases(moe):
    """{name: {"shape": (T, D, F, E, K), "registry": bool, "source": str}}; the script's own
    shapes for the public models (they do not depend on `moe bench` listing them)."""
    try:
        reg = registry_shapes(moe)
    except (OSError, SystemExit) as e:
        print(f"torch_compare: no registry cases ({e})", file=sys.stderr)
        reg = {}
    cases = {n: {"shape": s, "registry": True, "source": "moe bench --list"} for n, s in reg.items()}
    for n, (*shape, src) in MODELS.items():
        on_reg = n in reg and reg[n][1:] == tuple(shape[1:])
        # on the registry with the same experts: its T, so that the `moe bench` row times the same step
        cases[n] = {"shape": reg[n] if on_reg else tuple(shape), "registry": on_reg, "source": src}
    return cases


def cpu_info():
    model, flags = platform.processor(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    level = "amx_bf16" if {"amx_bf16", "amx_tile", "avx512_bf16"} <= flags else \
        "avx512_bf16" if "avx512_bf16" in flags else "avx512" if "avx512f" in flags else \
        "avx2" if "avx2" in flags and "fma" in flags else "other"
    return {"model": model, "level": level, "cores": len(os.sched_getaffinity(0))}


def torch_blas():
    """Which BLAS this process's PyTorch calls (the libraries mapped after a matmul), OpenBLAS's
    core and settings (openblas_get_corename / _config through ctypes, the OPENBLAS_* variables),
    threadpoolctl's view when installed, and the GFLOP/s of 2048^3 matmuls in f32 and bf16."""
    a = torch.randn(2048, 2048)
    a @ a
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and re.search(r"(openblas|libblas|mkl|blis|atlas)", os.path.basename(parts[-1])):
                libs.add(os.path.realpath(parts[-1]))
    malloc = "glibc"
    with open("/proc/self/maps") as f:
        for line in f:
            m = re.search(r"lib(tcmalloc\w*|jemalloc|mimalloc)", line)
            if m:
                malloc = m.group(1)
                break
    info = {"libraries": sorted(libs), "blas": "unknown: " + ", ".join(sorted(libs)), "malloc": malloc,
            "env": {k: v for k, v in os.environ.items() if k.startswith("OPENBLAS_") or k.startswith("OMP_")}}
    for path in sorted(libs):
        if "openblas" not in path:
            continue
        info["blas"] = "OpenBLAS"
        try:
            lib = ctypes.CDLL(path)
            lib.openblas_get_corename.restype = ctypes.c_char_p
            lib.openblas_get_config.restype = ctypes.c_char_p
            info["openblas_core"] = lib.openblas_get_corename().decode()
            info["openblas_config"] = lib.openblas_get_config().decode()
            info["openblas_threads"] = lib.openblas_get_num_threads()
        except (OSError, AttributeError) as e:
            info["openblas_core"] = f"unknown ({e})"
        break
    try:
        import threadpoolctl  # Debian: python3-threadpoolctl (optional)
        info["threadpoolctl"] = threadpoolctl.threadpool_info()
    except ImportError:
        pass
    for name, dt in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        b = a.to(dt)
        b @ b
        times = []
        for _ in range(3):
            t = time.perf_counter()
            b @ b
            times.append(time.perf_counter() - t)
        info[f"{name}_matmul_2048_gflops"] = round(2 * 2048 ** 3 / statistics.median(times) / 1e9, 1)
    return info


# ---------------------------------------------------------------------------------------------
# measurement

def _status_kib(key):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak():
    """Resets VmHWM (Linux >= 4.0: write 5 to /proc/self/clear_refs); False if not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class Meter:
    """CPU time (user, system), minor faults and peak RSS over a stretch of steps."""

    def __init__(self):
        self.peak_reset = _reset_peak()
        self.r0 = resource.getrusage(resource.RUSAGE_SELF)
        self.t0 = time.perf_counter()

    def done(self, steps, flops, busy_s=None):
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        wall = time.perf_counter() - self.t0
        user, sys_ = r1.ru_utime - self.r0.ru_utime, r1.ru_stime - self.r0.ru_stime
        hwm = _status_kib("VmHWM") if self.peak_reset else None
        busy = busy_s if busy_s is not None else wall
        return {"steps": steps, "seconds": round(busy, 4), "gflops": round(flops / busy / 1e9, 2) if busy else None,
                "sys_share": round(sys_ / (user + sys_), 4) if user + sys_ > 0 else 0.0,
                "cpu_per_wall": round((user + sys_) / wall, 2) if wall > 0 else None,
                "minflt_per_step": round((r1.ru_minflt - self.r0.ru_minflt) / max(1, steps), 1),
                "peak_rss_mib": round((hwm if hwm is not None else r1.ru_maxrss) / 1024, 1),
                "peak_rss_kind": "VmHWM" if hwm is not None else "ru_maxrss (process lifetime)",
                "rss_after_mib": round((_status_kib("VmRSS") or 0) / 1024, 1)}


def fmt_meter(m):
    return (f"sys {100 * m['sys_share']:4.1f}%  {m['minflt_per_step']:8.1f} minflt/step  "
            f"peak RSS {m['peak_rss_mib']:7.1f} MiB")


def make_weights(T, D, Fd, E, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(T, D, generator=g), "dy": torch.randn(T, D, generator=g),
            "router": torch.randn(D, E, generator=g) * D ** -0.5,
            "wi_0": torch.randn(E, D, Fd, generator=g) * D ** -0.5,
            "wi_1": torch.randn(E, D, Fd, generator=g) * D ** -0.5,
            "wo": torch.randn(E, Fd, D, generator=g) * Fd ** -0.5}


def fwd_flops(T, D, Fd, E, K):
    return 6 * T * K * D * Fd + 2 * T * D * E  # as `moe bench` counts (docs/benchmarks.md)


def run_step(block, x0, dy):
    """Forward then backward of sum(y * dy) + the aux losses: (t_fwd, t_total)."""
    x = x0.clone().requires_grad_(True)
    t0 = time.perf_counter()
    y, aux = block(x)
    t1 = time.perf_counter()
    torch.autograd.backward([y, aux["load_balance_loss"] + aux["z_loss"]], [dy, torch.ones(())])
    t2 = time.perf_counter()
    return t1 - t0, t2 - t0


def plain_block(name, w, dtype, K):
    """(block(x) -> (y, aux), reset(), params) of a plain PyTorch block with leaf weights."""
    cfg = dict(util.ROUTING_DEFAULTS)
    if name in torch_blocks.BLOCKS:
        params = torch_blocks.make_params(w, dtype)
        fn = torch_blocks.BLOCKS[name]

        def block(x):
            return fn(x, params, K, cfg)
    else:
        params = {n: (w[n].clone() if n == "router" else w[n].to(dtype)).requires_grad_(True)
                  for n in ("router", "wi_0", "wi_1", "wo")}
        fn = util.TORCH_BLOCKS[name]

        def block(x):
            return fn(x, params["router"], params["wi_0"], params["wi_1"], params["wo"], K, cfg)

    def reset():
        for p in params.values():
            p.grad = None
    return block, reset, list(params.values())


def engine_block(moe_engine, w, dtype, shape, accumulate=False):
    T, D, Fd, E, K = shape
    layer = moe_engine.torch.MoELayer(num_experts=E, num_experts_per_tok=K, emb_dim=D, moe_mlp_dim=Fd, dtype=dtype,
                                      accumulate_grads=accumulate)
    with torch.no_grad():
        for n in ("router", "wi_0", "wi_1", "wo"):
            getattr(layer, n).copy_(w[n])

    def reset():
        layer.zero_grad(set_to_none=True)
    return layer, reset, list(layer.parameters())


def make_impl(impl, moe_engine, w, dtype, shape, accumulate=False):
    if impl == "MoELayer":
        return engine_block(moe_engine, w, dtype, shape, accumulate)
    return plain_block(impl[len("torch-"):], w, dtype, shape[4])


def time_steps(block, reset, x0, dy, warmup, repeats, flops):
    """warmup + repeats fwd+bwd steps: (fwd times, total times, Meter result of the timed ones)."""
    for _ in range(warmup):
        reset()
        run_step(block, x0, dy)
    fwd, tot = [], []
    meter = Meter()
    for _ in range(repeats):
        reset()
        f, t = run_step(block, x0, dy)
        fwd.append(f)
        tot.append(t)
    return fwd, tot, meter.done(repeats, 3 * flops * repeats, sum(tot))


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


def mem_estimate_gib(shape, n_impls=1):
    """Rough resident bytes of one implementation at a time: the script's f32 copy of the weights,
    the f32 weights (masters) and their f32 gradients, a compute-dtype copy and the activations."""
    T, D, Fd, E, K = shape
    w = 3 * E * D * Fd * 4
    act = T * K * (D + 3 * Fd) * 4 * 2
    return (3.5 * w + act) * n_impls / 2 ** 30


def mem_available_gib():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2 ** 20
    except OSError:
        pass
    return None


# ---------------------------------------------------------------------------------------------
# scenarios

class Run:
    def __init__(self, a, moe_engine, cases, threads):
        self.a, self.moe_engine, self.cases, self.threads = a, moe_engine, cases, threads
        self.results, self.summary = [], {}

    def shape(self, case):
        T, D, Fd, E, K = self.cases[case]["shape"]
        return (self.a.tokens or T, D, Fd, E, K)

    def record(self, scenario, case, impl, dtype, pass_, times, flops, meter=None, extra=None):
        med = statistics.median(times) * 1e3
        r = {"scenario": scenario, "case": case, "impl": impl, "dtype": dtype, "pass": pass_,
             "median_ms": round(med, 3), "min_ms": round(min(times) * 1e3, 3), "max_ms": round(max(times) * 1e3, 3),
             "gflops": round(flops / med / 1e6, 2)}
        if meter:
            r["meter"] = meter
        r.update(extra or {})
        self.results.append(r)
        tail = ("  " + fmt_meter(meter)) if meter else ""
        print(f"  {case:<20} {impl:<19} {dtype:<5} {pass_:<8} {med:10.1f} ms  {r['gflops']:7.1f} GFLOP/s{tail}",
              flush=True)
        return r

    def impls(self, engine=True):
        out = ["torch-" + b for b in self.a.block]
        return out + (["MoELayer"] if engine and self.moe_engine else [])

    def real_use_impls(self):
        return ([] if self.a.engine_only else self.impls()[:1]) + (["MoELayer"] if self.moe_engine else [])

    # compare --------------------------------------------------------------------------------
    def compare(self):
        a = self.a
        for case in a.case:
            shape = self.shape(case)
            T, D, Fd, E, K = shape
            flops = fwd_flops(*shape)
            print(f"compare {case}: T={T} D={D} F={Fd} E={E} K={K} ({self.cases[case]['source']})", flush=True)
            w = make_weights(*shape[:4])
            for dt in a.dtype:
                dtype = DTYPES[dt]
                x0, dy = w["x"].to(dtype), w["dy"].to(dtype)
                for impl in self.impls():
                    block, reset, _ = make_impl(impl, self.moe_engine, w, dtype, shape)
                    f, t, m = time_steps(block, reset, x0, dy, a.warmup, a.repeats, flops)
                    self.record("compare", case, impl, dt, "fwd", f, flops)
                    self.record("compare", case, impl, dt, "fwd+bwd", t, 3 * flops, m)
                    del block, reset
                if self.moe_engine and self.cases[case]["registry"] and not a.tokens:
                    cmd, isa, rows = moe_bench(a.moe, case, dt, a.repeats, a.warmup, self.threads)
                    for pass_ in ("fwd", "fwd+bwd"):
                        r = rows[pass_]
                        self.results.append({"scenario": "compare", "case": case, "impl": "moe-bench", "dtype": dt,
                                             "pass": pass_, "median_ms": r["median_ms"], "min_ms": r["min_ms"],
                                             "max_ms": r["max_ms"], "gflops": r["gflops"], "isa": isa,
                                             "command": " ".join(cmd)})
                        print(f"  {case:<20} {'moe-bench':<19} {dt:<5} {pass_:<8} {r['median_ms']:10.1f} ms  "
                              f"{r['gflops']:7.1f} GFLOP/s  ({isa})", flush=True)
        self.compare_ratios()

    def compare_ratios(self):
        a = self.a

        def med(case, impl, dt):
            for r in self.results:
                if (r["scenario"], r["case"], r["impl"], r["dtype"], r["pass"]) == ("compare", case, impl, dt, "fwd+bwd"):
                    return r["median_ms"]
            return None
        ratios = []
        print("\nfwd+bwd ratios (MoELayer faster by = plain ms / MoELayer ms):")
        for case in a.case:
            rec = {"case": case}
            for dt in a.dtype:
                eng = med(case, "MoELayer", dt)
                for b in a.block:
                    p = med(case, "torch-" + b, dt)
                    if p is not None and eng:
                        rec[f"{b}/{dt}"] = round(p / eng, 3)
                mb = med(case, "moe-bench", dt)
                if mb and eng:
                    rec[f"binding_overhead/{dt}"] = round(eng / mb, 3)
            plain = [(med(case, "torch-" + b, dt), "torch-" + b, dt) for b in a.block if b != "dense"
                     for dt in a.dtype]
            plain = [p for p in plain if p[0] is not None]
            if plain:
                best = min(plain)
                rec["best_plain"] = {"impl": best[1], "dtype": best[2], "median_ms": best[0]}
            engs = [(med(case, "MoELayer", dt), dt) for dt in a.dtype if med(case, "MoELayer", dt)]
            if engs and plain:
                e = min(engs)
                rec["best_engine"] = {"dtype": e[1], "median_ms": e[0]}
                rec["speedup_vs_best_plain"] = round(best[0] / e[0], 3)
            ratios.append(rec)
            print(f"  {case}: " + ", ".join(f"{k} {v}" for k, v in rec.items() if k != "case"))
        self.summary["compare"] = ratios

    # changing-t -----------------------------------------------------------------------------
    def changing_t(self):
        a = self.a
        dt = a.dtype[0]
        dtype = DTYPES[dt]
        out = []
        for case in a.case:
            shape = self.shape(case)
            T, D, Fd, E, K = shape
            # T around the fixed one, as `moe bench --scenario changing-t` draws it (variable-length
            # batches): the same mean work per step, so the rates compare the memory system, not
            # the kernels at smaller shapes.
            lo, hi = max(1, 3 * T // 4), 5 * T // 4
            rng = random.Random(1)
            ts = [rng.randint(lo, hi) for _ in range(a.changing_steps)]
            print(f"changing-t {case}: fixed T={T}, then {a.changing_steps} steps with T uniform in "
                  f"[{lo}, {hi}] (mean {statistics.mean(ts):.0f}); {dt}", flush=True)
            w = make_weights(hi, D, Fd, E)
            x_all, dy_all = w["x"].to(dtype), w["dy"].to(dtype)
            for impl in self.real_use_impls():
                block, reset, _ = make_impl(impl, self.moe_engine, w, dtype, shape)
                fixed_steps = max(a.repeats, 3)
                _, tot, mf = time_steps(block, reset, x_all[:T], dy_all[:T], a.warmup, fixed_steps, fwd_flops(*shape))
                self.record("changing-t", case, impl, dt, "fixed-T", tot, 3 * fwd_flops(*shape), mf)
                meter = Meter()
                times, flops = [], 0
                for Ti in ts:
                    reset()
                    _, t = run_step(block, x_all[:Ti], dy_all[:Ti])
                    times.append(t)
                    flops += 3 * fwd_flops(Ti, D, Fd, E, K)
                mc = meter.done(len(ts), flops, sum(times))
                rss_after = _status_kib("VmRSS") / 1024
                mean_flops = flops / len(ts)
                r = self.record("changing-t", case, impl, dt, "changing", times, mean_flops, mc)
                rate = mc["gflops"] / mf["gflops"]
                growth = rss_after / mf["peak_rss_mib"]
                rec = {"case": case, "impl": impl, "dtype": dt, "fixed_gflops": mf["gflops"],
                       "changing_gflops": mc["gflops"], "rate_ratio": round(rate, 3),
                       "sys_share_fixed": mf["sys_share"], "sys_share_changing": mc["sys_share"],
                       "minflt_per_step_fixed": mf["minflt_per_step"], "minflt_per_step_changing": mc["minflt_per_step"],
                       "fixed_peak_rss_mib": mf["peak_rss_mib"], "rss_after_changing_mib": round(rss_after, 1),
                       "changing_peak_rss_mib": mc["peak_rss_mib"], "rss_growth": round(growth, 3)}
                r["summary"] = rec
                out.append(rec)
                print(f"    -> {impl}: changing/fixed GFLOP/s {rate:.3f} (target >= {TARGETS['changing_t_rate']}); "
                      f"sys {100 * mc['sys_share']:.1f}% (target < {100 * TARGETS['sys_share']:.0f}%); RSS after "
                      f"{len(ts)} changing steps / fixed-T peak {growth:.3f} (target <= {TARGETS['rss_growth']})",
                      flush=True)
                del block, reset
        self.summary["changing-t"] = out

    # sequence -------------------------------------------------------------------------------
    def one_case_engine(self, case, dtype_name):
        """MoELayer fwd+bwd of one case: (median s, Meter)."""
        shape = self.shape(case)
        dtype = DTYPES[dtype_name]
        w = make_weights(*shape[:4])
        layer, reset, _ = engine_block(self.moe_engine, w, dtype, shape)
        _, tot, m = time_steps(layer, reset, w["x"].to(dtype), w["dy"].to(dtype), self.a.warmup, self.a.repeats,
                               fwd_flops(*shape))
        return tot, m

    def sequence(self):
        a = self.a
        dt = a.dtype[0]
        print(f"sequence: {', '.join(a.case)} one after another in this process, then each in a fresh process; "
              f"MoELayer {dt} fwd+bwd", flush=True)
        same = {}
        for case in a.case:
            tot, m = self.one_case_engine(case, dt)
            same[case] = self.record("sequence", case, "MoELayer", dt, "same-proc", tot, 3 * fwd_flops(*self.shape(case)), m)
        out = []
        for case in a.case:
            cmd = [sys.executable, os.path.abspath(__file__), "--child", "--scenario", "sequence", "--case", case,
                   "--dtype", dt, "--repeats", str(a.repeats), "--warmup", str(a.warmup), "--threads",
                   str(self.threads), "--moe", a.moe] + (["--tokens", str(a.tokens)] if a.tokens else [])
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode != 0:
                raise SystemExit(f"torch_compare: {' '.join(cmd)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
            child = json.loads(res.stdout.strip().splitlines()[-1])
            r = self.record("sequence", case, "MoELayer", dt, "fresh", child["times"],
                            3 * fwd_flops(*self.shape(case)), child["meter"])
            ratio = same[case]["median_ms"] / r["median_ms"]
            out.append({"case": case, "dtype": dt, "same_ms": same[case]["median_ms"], "fresh_ms": r["median_ms"],
                        "same_over_fresh": round(ratio, 3),
                        "same_peak_rss_mib": same[case]["meter"]["peak_rss_mib"],
                        "fresh_peak_rss_mib": child["meter"]["peak_rss_mib"]})
            print(f"    -> {case}: same process / fresh process {ratio:.3f} (target within "
                  f"{100 * TARGETS['same_vs_fresh']:.0f}%)", flush=True)
        self.summary["sequence"] = out

    # accumulate -----------------------------------------------------------------------------
    def accumulate(self):
        a = self.a
        dt = a.dtype[0]
        dtype = DTYPES[dt]
        out = []
        for case in a.case:
            shape = self.shape(case)
            T, D, Fd, E, K = shape
            flops = fwd_flops(*shape)
            print(f"accumulate {case}: 2 micro-batches of T={T} accumulate their gradients, then an SGD update; {dt}; "
                  f"MoELayer(accumulate_grads=True)", flush=True)
            w = make_weights(2 * T, D, Fd, E)
            xs = [w["x"][:T].to(dtype), w["x"][T:].to(dtype)]
            dys = [w["dy"][:T].to(dtype), w["dy"][T:].to(dtype)]
            for impl in self.real_use_impls():
                gc.collect()
                base_mib = (_status_kib("VmRSS") or 0) / 1024  # before the layer is made
                block, reset, params = make_impl(impl, self.moe_engine, w, dtype, shape, accumulate=True)
                _, tot1, m1 = time_steps(block, reset, xs[0], dys[0], a.warmup, a.repeats, flops)
                self.record("accumulate", case, impl, dt, "1 micro", tot1, 3 * flops, m1)
                opt = torch.optim.SGD(params, lr=1e-6)

                def train_step():
                    opt.zero_grad(set_to_none=True)
                    t = 0.0
                    for x0, dy in zip(xs, dys):
                        t += run_step(block, x0, dy)[1]
                    t0 = time.perf_counter()
                    opt.step()
                    return t + time.perf_counter() - t0
                for _ in range(a.warmup):
                    train_step()
                meter = Meter()
                times = [train_step() for _ in range(a.repeats)]
                m2 = meter.done(a.repeats, 2 * 3 * flops * a.repeats, sum(times))
                self.record("accumulate", case, impl, dt, "2 micro", times, 2 * 3 * flops, m2)
                rec = {"case": case, "impl": impl, "dtype": dt, "single_gflops": m1["gflops"],
                       "accumulate_gflops": m2["gflops"], "rate_ratio": round(m2["gflops"] / m1["gflops"], 3),
                       "sys_share": m2["sys_share"], "minflt_per_step": m2["minflt_per_step"],
                       "peak_rss_mib": m2["peak_rss_mib"], "rss_before_layer_mib": round(base_mib, 1)}
                memory = ""
                if impl == "MoELayer":
                    # Peak RSS of the accumulating steps above the process before the layer was made,
                    # against what one step cannot do without (weights, their bf16 copies, gradients,
                    # saved tensors, x/dy/y/dx). Exact as the process's first layer: a previous case's
                    # pages still cached by the engine count in the base and may be reused.
                    mins = block.step_memory_minimum(T, dtype)
                    over = m2["peak_rss_mib"] - base_mib
                    rec.update(minimum_mib=round(mins["total"] / 2**20, 1), peak_above_start_mib=round(over, 1),
                               peak_over_minimum=round(over * 2**20 / mins["total"], 3))
                    memory = (f"; peak RSS above the start {over:.0f} MiB = {rec['peak_over_minimum']:.2f}x the "
                              f"step's minimum {rec['minimum_mib']:.0f} MiB (target <= {TARGETS['peak_over_minimum']})")
                out.append(rec)
                print(f"    -> {impl}: 2-micro-batch step GFLOP/s / plain fwd+bwd {rec['rate_ratio']:.3f}; sys "
                      f"{100 * m2['sys_share']:.1f}%{memory}", flush=True)
                del block, reset, params, opt
        self.summary["accumulate"] = out


def main(argv=None):
    a = parse_args(argv)
    cases = all_cases(a.moe)
    if a.list:
        for n, c in cases.items():
            T, D, Fd, E, K = c["shape"]
            print(f"{n:<22} T={T:<5} D={D:<5} F={Fd:<6} E={E:<4} K={K}  ~{mem_estimate_gib(c['shape']):.1f} GiB  "
                  f"{c['source']}")
        return 0
    for c in a.case:
        if c not in cases:
            raise SystemExit(f"torch_compare: case {c!r} is neither in the registry nor a public model "
                             f"({', '.join(sorted(cases))})")
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
    run = Run(a, moe_engine, cases, threads)
    if a.child:  # sequence: one case in this fresh process; one JSON line on stdout
        tot, m = run.one_case_engine(a.case[0], a.dtype[0])
        print(json.dumps({"times": tot, "meter": m}))
        return 0
    info = {"cpu": cpu_info(), "torch": torch.__version__, "torch_threads": threads,
            "engine_threads": threads if moe_engine else None, "load": os.getloadavg(), **torch_blas()}
    print(f"CPU {info['cpu']['model']} ({info['cpu']['level']}, {info['cpu']['cores']} cores); torch {info['torch']}; "
          f"{threads} threads; load average {' '.join(f'{v:.1f}' for v in info['load'])}", flush=True)
    print(f"BLAS {info['blas']} core {info.get('openblas_core', '-')} ({info.get('openblas_config', '-')}); "
          f"env {info['env'] or '-'}; 2048^3 matmul f32 {info['f32_matmul_2048_gflops']} GFLOP/s, bf16 "
          f"{info['bf16_matmul_2048_gflops']} GFLOP/s", flush=True)
    print(f"malloc {info['malloc']}", flush=True)
    if info["malloc"] == "glibc":
        print("  note: PyTorch runs with glibc's malloc here, not at its best on a CPU: preload tcmalloc or "
              "jemalloc for a fair comparison (docs/python_benchmarks.md, Headline)", flush=True)
    if "threadpoolctl" in info:
        for pool in info["threadpoolctl"]:
            print(f"  threadpoolctl: {pool.get('internal_api')} {pool.get('version')} {pool.get('architecture', '')} "
                  f"threads {pool.get('num_threads')} ({pool.get('filepath')})")
    avail = mem_available_gib()
    for c in a.case:
        need = mem_estimate_gib(run.shape(c))
        if avail is not None and need > avail:
            raise SystemExit(f"torch_compare: case {c} needs about {need:.1f} GiB, {avail:.1f} GiB available")
    for s in a.scenario:
        getattr(run, s.replace("-", "_"))()
    info["load_after"] = os.getloadavg()
    print(f"load average at the end {' '.join(f'{v:.1f}' for v in info['load_after'])}")
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        util.atomic_write_bytes(a.json, [json.dumps({"setup": info, "args": sys.argv[1:], "results": run.results,
                                                     "summary": run.summary, "targets": TARGETS},
                                                    indent=1).encode() + b"\n"])
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
