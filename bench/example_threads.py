#!/usr/bin/env python3
"""Training tokens/s of examples/tiny_mixtral.py for each setting of PyTorch's threads and the
engine pool's threads (1 and 2 each, and the default), both --ffn modes, in one run.

    PYTHONPATH=build/python /usr/bin/python3 bench/example_threads.py [--steps N] [--rounds R] [--json FILE]

Each run trains --steps steps of the default model (the schedule of the default run, stopped with
--until) and reports tokens / time over the steps after the first; with --rounds R the settings
run R times interleaved (ABAB...) and the median is kept, so a change of the machine's load hits
every setting alike. docs/python_benchmarks.md quotes its output.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
EXAMPLE = os.path.join(ROOT, "examples", "tiny_mixtral.py")


def run(ffn, torch_threads, engine_threads, steps, extra, out):
    cmd = [sys.executable, EXAMPLE, "--ffn", ffn, "--until", str(steps), "--eval-every", "100000",
           "--sample", "0", "--checkpoint-every", "0", "--log-every", "100000", "--out", out] + extra
    if torch_threads:
        cmd += ["--torch-threads", str(torch_threads)]
    if engine_threads and ffn == "engine":
        cmd += ["--engine-threads", str(engine_threads)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    m = re.search(r"([\d,]+) tokens/s \(steps after the first\)", p.stdout)
    if p.returncode != 0 or not m:
        raise SystemExit(f"example_threads: {' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    t = re.search(r"threads torch (\d+) engine (\S+)", p.stdout)
    return float(m.group(1).replace(",", "")), t.group(1), t.group(2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--dtype", default="f32")
    ap.add_argument("--json")
    a = ap.parse_args()
    settings = [(ffn, tt, et) for ffn in ("engine", "torch") for tt, et in
                ([(0, 0), (1, 1), (1, 2), (2, 1), (2, 2)] if ffn == "engine" else [(0, 0), (1, 0), (2, 0)])]
    rates = {s: [] for s in settings}
    resolved = {}
    with tempfile.TemporaryDirectory() as d:
        for _ in range(a.rounds):
            for s in settings:
                r, tt, et = run(*s, a.steps, ["--dtype", a.dtype], os.path.join(d, "run"))
                rates[s].append(r)
                resolved[s] = (tt, et)
    rows = []
    print(f"{'ffn':<7} {'torch threads':>13} {'engine threads':>14} {'tokens/s':>10}")
    for s in settings:
        med = statistics.median(rates[s])
        tt, et = resolved[s]
        label_t = f"{tt}{' (default)' if s[1] == 0 else ''}"
        label_e = "-" if s[0] == "torch" else f"{et}{' (default)' if s[2] == 0 else ''}"
        print(f"{s[0]:<7} {label_t:>13} {label_e:>14} {med:>10,.0f}")
        rows.append({"ffn": s[0], "torch_threads": int(tt), "engine_threads": None if s[0] == "torch" else int(et),
                     "default": s[1] == 0 and s[2] == 0, "tokens_per_s": med, "runs": rates[s]})
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"steps": a.steps, "rounds": a.rounds, "dtype": a.dtype, "results": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
