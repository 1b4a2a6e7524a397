# shellcheck shell=bash
# Sourced by cluster_test.sh (mode train): `moe train` across hosts with checkpoints.
# The same mesh (fsdp 2 x expert 2, 4 ranks) on two host layouts: 2 hosts x 2 ranks (FSDP crosses
# hosts, EP stays inside) and 4 hosts x 1 rank (everything crosses). The host layout changes where
# bytes travel, never the arithmetic (the engine adds in rank order), so:
#   straight 2x2 == straight 4x1 (tensors at step 6, losses of steps 1-6), and a step-3 checkpoint
#   written on either layout, resumed on either layout, ends bit-identical to the straight run.
write_train_config
up t2x2 2 2
C22=$C
up t4x1 4 1
C41=$C
check_placement "$C22" 2 2
check_placement "$C41" 4 1

# train C WHAT ARGS...: moe train c.yml on cluster C's 4 ranks.
train() {
  local c=$1 what=$2
  shift 2
  timeout 120 "$c/mpirun" -np 4 "$MOE" train c.yml "$@" > "$what.log" 2>&1 ||
    { tail -20 "$what.log"; die "moe train $what ($*) on ${c##*/} failed"; }
}
# "step loss ..." of each metrics line without the timing fields.
losses() { sed 's/"step_ms".*//' "$1"; }
same_as_straight() {  # same_as_straight DIR METRICS WHAT
  cmp -s "$(tensor_bytes s22/ckpt-00000006.safetensors)" "$(tensor_bytes "$1"/ckpt-00000006.safetensors)" ||
    die "$3: the step-6 checkpoint's tensors differ from the straight 2x2 run"
  sed -n '/"step":[456],/p' s22.jsonl | losses /dev/stdin > want.txt
  losses "$2" | sed -n '/"step":[456],/p' | cmp -s - want.txt || die "$3: losses of steps 4-6 differ from the straight 2x2 run"
  echo "$3: tensors at step 6 and losses of steps 4-6 bit-identical to the straight 2x2 run"
}

before22=$(link_bytes "$C22") before41=$(link_bytes "$C41")
train "$C22" s22 checkpoint_dir=s22 metrics_file=s22.jsonl
train "$C41" s41 checkpoint_dir=s41 metrics_file=s41.jsonl
cmp -s "$(tensor_bytes s22/ckpt-00000006.safetensors)" "$(tensor_bytes s41/ckpt-00000006.safetensors)" ||
  die "straight runs: the step-6 tensors differ between 2x2 and 4x1"
[ "$(losses s22.jsonl)" = "$(losses s41.jsonl)" ] || die "straight runs: the losses differ between 2x2 and 4x1"
[ "$(grep -c '"step"' s22.jsonl)" = 6 ] || die "straight 2x2 run: expected 6 metrics lines"
echo "straight 6 steps: 2x2 and 4x1 bit-identical (tensors and losses)"

train "$C22" u22 checkpoint_dir=u22 --until 3
train "$C41" u41 checkpoint_dir=u41 --until 3
cp -r u22 x22 && cp -r u41 x41
train "$C22" r22 --resume u22 metrics_file=r22.jsonl
same_as_straight u22 r22.jsonl "written on 2x2, resumed on 2x2"
train "$C41" r41 --resume u41 metrics_file=r41.jsonl
same_as_straight u41 r41.jsonl "written on 4x1, resumed on 4x1"
train "$C41" x22 --resume x22 metrics_file=x22.jsonl
same_as_straight x22 x22.jsonl "written on 2x2, resumed on 4x1"
train "$C22" x41 --resume x41 metrics_file=x41.jsonl
same_as_straight x41 x41.jsonl "written on 4x1, resumed on 2x2"
check_traffic "$before22" "$(link_bytes "$C22")" 100000
check_traffic "$before41" "$(link_bytes "$C41")" 100000
