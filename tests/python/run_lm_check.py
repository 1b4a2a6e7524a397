#!/usr/bin/env python3
"""CTest check of the main job's logic after the build, scripts/run_lm.sh (what scripts/run.sh runs
after installing and building), at tiny sizes (CTest: run_lm_job).

1. script: --until 3, then --resume to step 6 (run_lm.sh keeps the output directory on --resume
   and empties it otherwise): the printed config, progress with ETA, held-out loss against the
   unigram entropy, tokens/s, the sample; metrics.jsonl (6 steps), the step-6 checkpoint,
   `latest` and moe report's SVG;
2. errors: a bad MOE_RANKS and a missing build are refused with a message naming them;
3. mpi: MOE_RANKS=2 (mpirun -np 2, expert parallelism) prints the same per-step losses as one
   process within 1e-5 relative, and writes its SVG.

    /usr/bin/python3 tests/python/run_lm_check.py [--build build] [--mpirun mpirun] [--skip-mpi]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SCRIPT = os.path.join(ROOT, "scripts", "run_lm.sh")
TINY = ["--dim", "32", "--heads", "2", "--layers", "2", "--experts", "4", "--top-k", "2", "--mlp-dim", "64",
        "--seq-len", "32", "--batch", "4", "--steps", "6", "--warmup", "2", "--eval-every", "3",
        "--eval-batches", "1", "--sample", "16", "--log-every", "1", "--checkpoint-every", "3"]
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def job(args, env, expect_rc=0, timeout=120):
    p = subprocess.run(["bash", SCRIPT] + list(args), env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != expect_rc:
        raise SystemExit(f"FAIL: run_lm.sh {' '.join(args)} exited {p.returncode}, expected {expect_rc}\n"
                         f"{p.stdout}\n{p.stderr}")
    return p.stdout + p.stderr


def metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--mpirun", default="mpirun")
    p.add_argument("--skip-mpi", action="store_true")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, MOE_OUT=f"{d}/one", MOE_BUILD=a.build, MOE_PYTHON=sys.executable, MOE_RANKS="1")
        lm = f"{d}/one/lm"
        os.makedirs(lm)
        with open(f"{lm}/stale.txt", "w") as f:
            f.write("from an earlier run\n")

        # 1. script
        first = job(TINY + ["--until", "3"], env)
        check(not os.path.exists(f"{lm}/stale.txt"), "script: a fresh run empties MOE_OUT/lm first")
        check([m["step"] for m in metrics(f"{lm}/metrics.jsonl")] == [1, 2, 3], "script: --until 3 ran steps 1-3")
        check("config:" in first and "  moe layer " in first, "script: prints the resolved config")
        log = job(TINY + ["--resume"], env)
        check("resumed from" in log and "at step 3" in log, "script: --resume keeps the directory and continues at step 3")
        m1 = metrics(f"{lm}/metrics.jsonl")
        check([m["step"] for m in m1] == [1, 2, 3, 4, 5, 6], "script: metrics.jsonl holds steps 1-6")
        check("ETA" in log and "tokens/s" in log, "script: progress lines with tokens/s and ETA")
        check("held-out loss" in log and "unigram entropy" in log, "script: held-out loss against the unigram entropy")
        check("of the forward FLOPs" in log, "script: prints the MoE FFNs' share of the FLOPs")
        check("sample:\nThe " in log, "script: prints a sample after the prompt")
        check(os.path.exists(f"{lm}/ckpt-00000006.safetensors") and open(f"{lm}/latest").read().strip()
              == "ckpt-00000006.safetensors", "script: step-6 checkpoint and latest")
        svg = f"{lm}/report.svg"
        ok = os.path.exists(svg) and "<svg" in open(svg).read(4096)
        check(ok and f"report: {svg}" in log, "script: moe report's SVG written and named")

        # 2. errors
        bad = job(TINY, dict(env, MOE_RANKS="two"), expect_rc=2)
        check("MOE_RANKS must be a positive integer, got 'two'" in bad, "errors: MOE_RANKS=two refused")
        bad = job(TINY, dict(env, MOE_BUILD=f"{d}/nowhere"), expect_rc=2)
        check(f"{d}/nowhere/moe missing" in bad, "errors: a missing build is named")

        # 3. mpi
        if not a.skip_mpi:
            env2 = dict(env, MOE_OUT=f"{d}/two", MOE_RANKS="2", MOE_MPIRUN=a.mpirun)
            log2 = job(TINY, env2)
            m2 = metrics(f"{d}/two/lm/metrics.jsonl")
            worst = max(abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(m2, m1))
            check("2 rank(s)" in log2 and "expert_parallelism=2" in log2, "mpi: two ranks, expert_parallelism=2")
            check(len(m2) == 6 and worst <= 1e-5,
                  f"mpi: per-step losses vs one process, worst relative difference {worst:.2e} <= 1e-5")
            check(os.path.exists(f"{d}/two/lm/report.svg"), "mpi: report.svg written")
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
