#!/bin/sh
# `moe train` under mpirun (docs/training.md "Distributed training"), run by CTest:
#   train_dist_test.sh MPIEXEC MOE WORKDIR vs_single|resume|corrupt
# vs_single: 3 steps of expert_parallelism=2 on 2 ranks give the single-process
#   loss trajectory within TOL (relative).
# resume: a checkpoint written under ep2 at step 3 resumes bit-exactly under ep2
#   (same checkpoint file at step 6 as a straight ep2 run) and within TOL under
#   one process and under fsdp2.
# corrupt: a corrupt checkpoint read by rank 0 ends the job with the message
#   and a non-zero status, never a hang (timeout).
set -u
MPI=$1 MOE=$2 DIR=$3 MODE=$4
TOL=1e-5
rm -rf "$DIR" && mkdir -p "$DIR" && cd "$DIR" || exit 1
cat > c.yml <<'YML'
num_experts: 4
num_experts_per_tok: 2
emb_dim: 16
moe_mlp_dim: 16
dtype: f32
num_layers: 2
batch_tokens: 32
learning_rate: 0.01
warmup_steps: 2
steps: 6
log_period: 1
YML

die() { echo "FAIL: $*"; exit 1; }
single() { "$MOE" train c.yml "$@" > /dev/null || die "single-process moe train $*"; }
np2() { timeout 60 "$MPI" --oversubscribe -np 2 "$MOE" train c.yml "$@" > /dev/null || die "mpirun moe train $*"; }
# A file holding the tensor data of a safetensors file (after its 8-byte size and JSON header).
tensor_bytes() {
  n=$(od -An -t u8 -N8 "$1" | tr -d ' ')
  tail -c +$((n + 9)) "$1" > "$1.data" && echo "$1.data"
}
# "step loss" pairs of a metrics file.
losses() { sed -n 's/.*"step":\([0-9]*\),"loss":\([^,]*\),.*/\1 \2/p' "$1"; }
# Same steps, |a - b| <= TOL * |a| per step; prints the worst relative difference.
close() {
  losses "$1" > a.txt && losses "$2" > b.txt
  [ -s a.txt ] && [ "$(wc -l < a.txt)" = "$(wc -l < b.txt)" ] || die "$1 and $2 have different steps"
  paste a.txt b.txt | awk -v tol=$TOL -v what="$1 vs $2" '
    { if ($1 != $3) bad = 1; d = $2 - $4; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2); if (r > w) w = r }
    END { printf "%s: worst relative loss difference %.3g (tolerance %g)\n", what, w, tol; exit (bad || w > tol) }' ||
    die "$1 and $2 differ beyond $TOL"
}

case $MODE in
vs_single)
  single steps=3 metrics_file=s.jsonl
  np2 steps=3 expert_parallelism=2 metrics_file=d.jsonl
  close s.jsonl d.jsonl
  ;;
resume)
  single metrics_file=s.jsonl
  np2 expert_parallelism=2 checkpoint_dir=a metrics_file=a.jsonl
  np2 expert_parallelism=2 checkpoint_dir=b --until 3
  cp -r b c && cp -r b f
  np2 expert_parallelism=2 --resume b metrics_file=b.jsonl
  # The tensors (the bytes after the JSON header; its metadata names checkpoint_dir) and the losses.
  cmp -s "$(tensor_bytes a/ckpt-00000006.safetensors)" "$(tensor_bytes b/ckpt-00000006.safetensors)" ||
    die "ep2 resume is not bit-exact with the straight ep2 run"
  sed -n '/"step":[456],/p' a.jsonl | sed 's/"step_ms".*//' > a46.txt
  sed 's/"step_ms".*//' b.jsonl | cmp -s - a46.txt || die "ep2 resume: losses differ from the straight ep2 run"
  echo "ep2 -> ep2 resume: tensors at step 6 and losses of steps 4-6 bit-identical to the straight ep2 run"
  single --resume c metrics_file=c.jsonl
  np2 fsdp_parallelism=2 --resume f metrics_file=f.jsonl
  sed -n '/"step":[456],/p' s.jsonl > s46.jsonl
  close s46.jsonl c.jsonl
  close s46.jsonl f.jsonl
  close s.jsonl a.jsonl
  ;;
corrupt)
  single checkpoint_dir=k --until 3
  printf 'garbage' > k/ckpt-00000003.safetensors
  out=$(timeout 60 "$MPI" --oversubscribe -np 2 "$MOE" train c.yml expert_parallelism=2 --resume k 2>&1)
  rc=$?
  echo "$out" | tail -5; echo "exit status $rc"
  [ $rc -ne 0 ] && [ $rc -ne 124 ] || die "expected a non-zero status without a timeout"
  echo "$out" | grep -q "fatal on rank 0: .*ckpt-00000003.safetensors" || die "the message does not name the file"
  ;;
*) die "unknown mode $MODE" ;;
esac
echo PASS
