#!/usr/bin/env bash
# Crash-safe checkpoints, proven (docs/reliability.md): `moe train` with a checkpoint every step is
# killed with SIGKILL at random moments KILLS times; after the kills every checkpoint left on disk
# must load (each is resumed on its own for one step), no temporary file may be taken for one,
# and the run resumed to its end must equal an uninterrupted run byte for byte. Then a write that
# fails for lack of space (ulimit -f, SIGXFSZ ignored: writes fail with EFBIG as on a full disk)
# must be a clear error that leaves the previous checkpoint intact and loadable.
# Usage: scripts/crash_checkpoints.sh [KILLS=50] [MOE=build/moe]   (CTest runs it with 10 kills)
set -uo pipefail
kills=${1:-50}
moe=$(realpath "${2:-build/moe}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
steps=400
RANDOM=${MOE_CRASH_SEED:-1}  # the kill schedule (moments still vary with the machine's timing)
# run DIR [ARGS...]: the same config and paths every time, so checkpoints compare byte for byte.
# run_exec execs moe, so `run_exec ... &` leaves moe's own pid in $! for the kill.
run() { (run_exec "$@"); }
run_exec() {
  local dir=$1
  shift
  exec "$moe" train steps=$steps checkpoint_period=1 keep_checkpoints=100000 log_period=100000 \
    checkpoint_dir="$dir/ck" metrics_file="$dir/metrics.jsonl" "$@"
}
fail() { echo "crash_checkpoints: FAIL: $*"; exit 1; }

# The uninterrupted run.
run "$work/run" >/dev/null 2>&1 || fail "the uninterrupted run failed"
mv "$work/run" "$work/ref"
final=$(printf 'ckpt-%08d.safetensors' $steps)

killed=0 restarts=0 resumed=0
while [ $killed -lt $kills ]; do
  args=()
  [ -f "$work/run/ck/latest" ] && args=(--resume "$work/run/ck") && resumed=$((resumed + 1))
  run_exec "$work/run" "${args[@]}" >"$work/log" 2>&1 &
  pid=$!
  sleep "0.$(printf '%03d' $((RANDOM % 900 + 100)))"
  if kill -9 $pid 2>/dev/null; then
    wait $pid 2>/dev/null
    killed=$((killed + 1))
  else
    wait $pid || { cat "$work/log"; fail "a run (resumed: ${#args[@]}) failed on its own"; }
  fi
  latest=$(cat "$work/run/ck/latest" 2>/dev/null || true)
  case $latest in
    "" | ckpt-*.safetensors) ;;
    *) fail "latest names '$latest', not a checkpoint" ;;
  esac
  [ -z "$latest" ] || [ -f "$work/run/ck/$latest" ] || fail "latest names $latest, which does not exist"
  if [ "$latest" = "$final" ]; then  # the run finished before the kill: compare, start over
    cmp -s "$work/ref/ck/$final" "$work/run/ck/$final" || fail "a finished run differs from the uninterrupted one"
    restarts=$((restarts + 1))
    mv "$work/run" "$work/done.$restarts"
  fi
done

# Every checkpoint left on disk loads: each resumed alone for one step.
checked=0
for d in "$work"/run "$work"/done.*; do
  [ -d "$d/ck" ] || continue
  for f in "$d"/ck/ckpt-*.safetensors; do
    [ -e "$f" ] || continue
    name=$(basename "$f")
    step=$((10#${name:5:8}))
    [ $step -lt $steps ] || continue
    one="$work/one"
    rm -rf "$one" && mkdir -p "$one/ck"
    cp "$f" "$one/ck/" && echo "$name" >"$one/ck/latest"
    run "$one" --resume "$one/ck" --until $((step + 1)) >"$work/log" 2>&1 || { cat "$work/log"; fail "$f does not load"; }
    checked=$((checked + 1))
  done
done
temps=$(find "$work" -name '*.tmp.*' | wc -l)

# Resume the interrupted run to its end: byte for byte the uninterrupted run's last checkpoint.
if [ -f "$work/run/ck/latest" ]; then
  run "$work/run" --resume "$work/run/ck" >"$work/log" 2>&1 || { cat "$work/log"; fail "the final resume failed"; }
  cmp -s "$work/ref/ck/$final" "$work/run/ck/$final" || fail "the resumed run differs from the uninterrupted one"
  restarts=$((restarts + 1))
fi
echo "crash_checkpoints: $killed kills (SIGKILL at random moments, checkpoint every step), $resumed resumes;" \
  "$checked checkpoints left on disk, every one loads; $temps temporary files left (removed at the next start);" \
  "$restarts runs finished, each byte-identical to the uninterrupted run"

# Out of space while writing a checkpoint: a clear error, the previous checkpoint intact.
rm -rf "$work/full" && mkdir -p "$work/full"
run "$work/full" --until 3 >/dev/null 2>&1 || fail "setting up the out-of-space run failed"
before=$(cat "$work/full/ck/latest")
cp "$work/full/ck/$before" "$work/before.safetensors"
size=$(($(stat -c %s "$work/before.safetensors") / 1024 / 2))  # half a checkpoint, in KiB blocks
(trap '' XFSZ && ulimit -f $size && run "$work/full" --resume "$work/full/ck" --until 4) >"$work/log" 2>&1
rc=$?
[ $rc -ne 0 ] || fail "a checkpoint larger than the space left was written without an error"
grep -q "moe: error" "$work/log" || { cat "$work/log"; fail "no clear error message for the failed write"; }
[ "$(cat "$work/full/ck/latest")" = "$before" ] || fail "latest moved off the previous checkpoint"
cmp -s "$work/before.safetensors" "$work/full/ck/$before" || fail "the previous checkpoint changed"
[ -z "$(find "$work/full/ck" -name '*.tmp.*')" ] || fail "the failed write left its temporary file behind"
run "$work/full" --resume "$work/full/ck" --until 4 >/dev/null 2>&1 || fail "the previous checkpoint no longer resumes"
echo "crash_checkpoints: out of space (ulimit -f ${size} KiB): exit $rc with: $(grep -m1 'moe: error' "$work/log")"
echo "crash_checkpoints: the previous checkpoint ($before) is intact and resumes"
echo "crash_checkpoints: OK"
