#!/bin/sh
# An error on one rank of a CLI command under mpirun ends the whole job
# (docs/reliability.md): a non-zero status, never a hang (`timeout` gives 124),
# with "moe: fatal on rank R: <message naming the file or option>". Run by CTest:
#   cli_abort_np2.sh MPIEXEC MOE WORKDIR step_overflow|train_ckpt_file|train_resume_overflow
# step_overflow: moe step whose weights file has a header number 1e400 (rank 0
#   reads it while rank 1 waits in the weights broadcast).
# train_ckpt_file: moe train with checkpoint_dir= an existing file (rank 0
#   prepares the directory before the first step while rank 1 goes on).
# train_resume_overflow: moe train --resume of a checkpoint holding 1e400.
set -u
MPI=$1 MOE=$2 DIR=$3 MODE=$4
rm -rf "$DIR" && mkdir -p "$DIR" && cd "$DIR" || exit 1
cat > c.yml <<'YML'
num_experts: 4
num_experts_per_tok: 2
emb_dim: 16
moe_mlp_dim: 16
dtype: f32
num_layers: 1
batch_tokens: 32
steps: 4
YML

die() { echo "FAIL: $*"; exit 1; }
# A safetensors file whose header holds the number 1e400 (nlohmann-json: out_of_range.406).
overflow_file() {
  h='{"router.kernel":{"dtype":"F32","shape":[1e400],"data_offsets":[0,4]}}'
  printf "$(printf '\\%03o' ${#h})\\000\\000\\000\\000\\000\\000\\000%s\\000\\000\\000\\000" "$h" > "$1"
}
# Runs "$@" under mpirun -np 2; requires a non-zero status without a timeout and
# the fatal message matching $NEEDLE (a grep -E pattern).
expect_abort() {
  start=$(date +%s)
  out=$(timeout 60 "$MPI" --oversubscribe -np 2 "$MOE" "$@" 2>&1)
  rc=$?
  echo "$out" | tail -5
  echo "exit status $rc after $(($(date +%s) - start)) s"
  [ $rc -ne 0 ] && [ $rc -ne 124 ] || die "expected a non-zero status without a timeout"
  echo "$out" | grep -Eq "$NEEDLE" || die "no line matches: $NEEDLE"
}

case $MODE in
step_overflow)
  "$MOE" init --config c.yml --out w.st --inputs in.st --tokens 8 > /dev/null || die "moe init"
  overflow_file bad.st
  NEEDLE="fatal on rank 0: .*bad.st: header is not valid JSON: .*1e400"
  expect_abort step --config c.yml --weights bad.st --inputs in.st --out o.st expert_parallelism=2
  [ ! -e o.st ] || die "an output file was written"
  ;;
train_ckpt_file)
  echo x > a_file
  NEEDLE="fatal on rank 0: checkpoint_dir: '.*a_file' exists and is not a directory"
  expect_abort train c.yml expert_parallelism=2 checkpoint_dir="$DIR/a_file"
  ;;
train_resume_overflow)
  mkdir k && overflow_file k/ckpt-00000003.safetensors && echo ckpt-00000003.safetensors > k/latest
  NEEDLE="fatal on rank 0: .*ckpt-00000003.safetensors: header is not valid JSON"
  expect_abort train c.yml expert_parallelism=2 --resume k
  ;;
*) die "unknown mode $MODE" ;;
esac
echo PASS
