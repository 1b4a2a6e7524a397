#!/usr/bin/env python3
"""CTest check of examples/tiny_mixtral.py, a few steps at tiny sizes (CTest: tiny_mixtral_example).

1. agree: --ffn engine and --ffn torch from the same weights and batches: the first steps' losses
   agree within the f32 bound (1e-4 relative), and bf16 engine vs f32 torch within the bf16 bound
   (2e-2 relative);
2. resume: 6 steps straight vs --until 3 then --resume: the same metrics (loss, grad norm) for
   steps 4-6 and a byte-identical final checkpoint; the metrics file is drawn by `moe report`;
3. mpi: `mpirun -np 2` (expert parallelism over the two ranks, each rank its half of every batch)
   under `timeout`: the losses match the single process within 1e-5 relative.

    PYTHONPATH=build/python /usr/bin/python3 tests/python/tiny_mixtral_check.py [--moe build/moe] [--mpirun mpirun]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
EXAMPLE = os.path.join(ROOT, "examples", "tiny_mixtral.py")
TINY = ["--dim", "32", "--heads", "2", "--layers", "2", "--experts", "4", "--top-k", "2", "--mlp-dim", "64",
        "--seq-len", "32", "--batch", "4", "--eval-every", "3", "--eval-batches", "1", "--sample", "8",
        "--log-every", "1", "--threads", "1", "--z-weight", "1e-3"]
failures = []


def run(args, out, launcher=(), timeout=120):
    cmd = list(launcher) + [sys.executable, EXAMPLE] + TINY + ["--out", out] + list(args)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise SystemExit(f"FAIL: {' '.join(cmd)} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p.stdout


def metrics(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--moe", default=os.path.join(ROOT, "build", "moe"))
    p.add_argument("--mpirun", default="mpirun")
    p.add_argument("--skip-mpi", action="store_true")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        # 1. agree
        steps = ["--steps", "4"]
        run(steps, f"{d}/eng")
        run(steps + ["--ffn", "torch"], f"{d}/tor")
        run(steps + ["--dtype", "bf16"], f"{d}/eng16")
        e, t, e16 = metrics(f"{d}/eng"), metrics(f"{d}/tor"), metrics(f"{d}/eng16")
        check(len(e) == len(t) == len(e16) == 4, "agree: 4 metrics lines per run")
        worst = max(rel(x["loss"], y["loss"]) for x, y in zip(e, t))
        check(worst <= 1e-4, f"agree: engine f32 vs torch f32 losses, worst relative difference {worst:.2e} <= 1e-4")
        worst16 = max(rel(x["loss"], y["loss"]) for x, y in zip(e16, t))
        check(worst16 <= 2e-2, f"agree: engine bf16 vs torch f32 losses, worst relative difference {worst16:.2e} <= 2e-2")
        check(e[-1]["loss"] < e[0]["loss"], f"agree: the loss falls ({e[0]['loss']:.4f} -> {e[-1]['loss']:.4f})")

        # 2. resume
        six = ["--steps", "6", "--checkpoint-every", "2"]
        run(six, f"{d}/straight")
        run(six + ["--until", "3"], f"{d}/split")
        first = metrics(f"{d}/split")
        check([m["step"] for m in first] == [1, 2, 3], "resume: --until 3 stops after step 3")
        log = run(six + ["--resume"], f"{d}/split")
        check("resumed from" in log and "at step 3" in log, "resume: continues from the step-3 checkpoint")
        s, r = metrics(f"{d}/straight"), metrics(f"{d}/split")
        key = [(m["step"], m["loss"], m["grad_norm"], m.get("val_loss")) for m in s]
        check(key == [(m["step"], m["loss"], m["grad_norm"], m.get("val_loss")) for m in r],
              "resume: metrics of steps 1-6 identical to the straight run (loss, grad norm, held-out loss)")
        with open(f"{d}/straight/ckpt-00000006.safetensors", "rb") as f1, \
                open(f"{d}/split/ckpt-00000006.safetensors", "rb") as f2:
            check(f1.read() == f2.read(), "resume: final checkpoint byte-identical to the straight run's")
        if os.path.exists(a.moe):
            rep = subprocess.run([a.moe, "report", f"{d}/straight/metrics.jsonl", "--out", f"{d}/r.svg"],
                                 capture_output=True, text=True)
            ok = rep.returncode == 0 and os.path.getsize(f"{d}/r.svg") > 0
            check(ok, f"report: moe report draws the metrics file {rep.stderr.strip()}")
        else:
            check(False, f"report: {a.moe} missing")

        # 3. mpi
        if not a.skip_mpi:
            env_launch = ["timeout", "90", a.mpirun, "--oversubscribe", "-np", "2"]
            if os.geteuid() == 0:
                os.environ.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
            run(["--steps", "3"], f"{d}/np2", launcher=env_launch)
            m2 = metrics(f"{d}/np2")
            worst = max(rel(x["loss"], y["loss"]) for x, y in zip(m2, e))
            check(len(m2) == 3 and worst <= 1e-5,
                  f"mpi: -np 2 expert parallelism vs one process, worst relative loss difference {worst:.2e} <= 1e-5")
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
