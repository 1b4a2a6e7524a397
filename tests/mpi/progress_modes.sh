#!/bin/sh
# `moe train --progress bar|lines|none|auto` (docs/training.md "Progress, metrics, summary"):
# the bar's carriage returns reach a log only when asked for or on an interactive terminal.
# Run by CTest: progress_modes.sh MOE WORKDIR [MPIEXEC]
# auto on a pseudo-terminal (util-linux `script`) draws the bar; the same pseudo-terminal with a
# batch system's job id, or under mpirun (which gives each rank's stdout a pseudo-terminal of its
# own even when its output goes to a file), writes lines.
set -u
MOE=$1 DIR=$2 MPI=${3:-}
rm -rf "$DIR" && mkdir -p "$DIR" && cd "$DIR" || exit 1
cat > c.yml <<'YML'
num_experts: 4
num_experts_per_tok: 2
emb_dim: 16
moe_mlp_dim: 16
dtype: f32
num_layers: 1
batch_tokens: 32
steps: 6
log_period: 2
YML
die() { echo "FAIL: $*"; exit 1; }
# A bar is a carriage return not at a line's end (a pseudo-terminal, script's or mpirun's, ends
# lines with \r\n).
has_cr() { [ "$(sed 's/\r$//' "$1" | tr -cd '\r' | wc -c)" -gt 0 ]; }
# Step lines of lines mode: "step N/6  loss ..." at the first step, every log_period and the last.
step_lines() { grep -c '^step [0-9]*/6 ' "$1"; }

"$MOE" train c.yml --progress sideways > bad.out 2>&1 && die "--progress sideways was accepted"
grep -q -- "--progress sideways: expected bar, lines, none or auto" bad.out || die "bad value: $(cat bad.out)"

"$MOE" train c.yml --progress lines > lines.out 2>&1 || die "lines: $(cat lines.out)"
has_cr lines.out && die "lines mode wrote a carriage return"
[ "$(step_lines lines.out)" -eq 4 ] || die "lines mode: expected steps 1, 2, 4, 6: $(cat lines.out)"

"$MOE" train c.yml --progress none > none.out 2>&1 || die "none: $(cat none.out)"
has_cr none.out && die "none mode wrote a carriage return"
[ "$(step_lines none.out)" -eq 0 ] || die "none mode wrote step lines"
grep -q '^summary (6 steps' none.out || die "none mode lost the summary"

"$MOE" train c.yml --progress bar > bar.out 2>&1 || die "bar: $(cat bar.out)"
has_cr bar.out || die "bar mode into a file drew no bar"

"$MOE" train c.yml > auto_pipe.out 2>&1 || die "auto into a file"
has_cr auto_pipe.out && die "auto into a file drew a bar"

if command -v script >/dev/null 2>&1; then
  TERM=xterm script -qec "\"$MOE\" train c.yml" /dev/null > tty.out 2>&1 || die "auto on a pty: $(cat tty.out)"
  has_cr tty.out || die "auto on an interactive pseudo-terminal drew no bar"
  TERM=xterm SLURM_JOB_ID=1 script -qec "\"$MOE\" train c.yml" /dev/null > batch.out 2>&1 || die "batch"
  has_cr batch.out && die "auto under a batch system drew a bar"
  grep -q '^step 2/6 ' batch.out || die "auto under a batch system wrote no step lines: $(cat batch.out)"
else
  echo "note: util-linux script not found: the pseudo-terminal cases are not run"
fi

if [ -n "$MPI" ]; then
  "$MPI" --oversubscribe -np 1 "$MOE" train c.yml > mpi.out 2>&1 || die "mpirun: $(cat mpi.out)"
  grep -q '^step 2/6 ' mpi.out || die "auto under mpirun wrote no step lines: $(cat mpi.out)"
  has_cr mpi.out && die "auto under mpirun drew a bar into the log"
  # The check can see a bar through mpirun (a rank's stdout is a pseudo-terminal there).
  "$MPI" --oversubscribe -np 1 "$MOE" train c.yml --progress bar > mpibar.out 2>&1 || die "mpirun bar"
  has_cr mpibar.out || die "--progress bar under mpirun drew no bar"
fi
echo "progress modes: ok"
