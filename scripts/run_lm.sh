#!/usr/bin/env bash
# The main job after the build (scripts/run.sh runs it; CTest's run_lm_job runs it at tiny sizes):
# trains the Mixtral-style byte-level language model of examples/tiny_mixtral.py on the Debian
# `fortunes` corpus, every block's FFN the engine's MoELayer, then draws `moe report`'s SVG.
#
#   bash scripts/run_lm.sh [tiny_mixtral.py flags ...]      # e.g. --steps 20 --dim 32
#
# Environment: MOE_OUT (default out; the job writes MOE_OUT/lm), MOE_RANKS (default 1; N > 1 runs
# N ranks under mpirun with expert parallelism over them), MOE_BUILD (default build),
# MOE_PYTHON (default /usr/bin/python3, Debian's, which has torch), MOE_MPIRUN (default mpirun).
# Without --resume among the flags, MOE_OUT/lm is emptied first. Documented in README.md and
# docs/python_example.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${MOE_OUT:-out}/lm
ranks=${MOE_RANKS:-1}
build=${MOE_BUILD:-$root/build}
python=${MOE_PYTHON:-/usr/bin/python3}
if ! [[ $ranks =~ ^[1-9][0-9]*$ ]]; then
  echo "run_lm.sh: MOE_RANKS must be a positive integer, got '$ranks'" >&2
  exit 2
fi
for f in "$build/moe" "$build/python/moe_engine"; do
  if [[ ! -e $f ]]; then
    echo "run_lm.sh: $f missing: build first (bash scripts/build.sh, or MOE_BUILD=<build dir>)" >&2
    exit 2
  fi
done
resume=0
for arg in "$@"; do [[ $arg == --resume ]] && resume=1; done
((resume)) || rm -rf "$out"
mkdir -p "$out"
launcher=()
if ((ranks > 1)); then
  launcher=("${MOE_MPIRUN:-mpirun}" --oversubscribe -np "$ranks")
  if [[ $(id -u) -eq 0 ]]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  fi
fi
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
# Prints the resolved config, progress with ETA, the held-out loss against the unigram entropy,
# tokens/s and a sample; writes metrics.jsonl and checkpoints under $out.
"${launcher[@]}" "$python" "$root/examples/tiny_mixtral.py" --out "$out" "$@"
"$build/moe" report "$out/metrics.jsonl" --out "$out/report.svg"
echo "report: $out/report.svg"
