# shellcheck shell=bash
# Sourced by cluster_test.sh (mode srun): Slurm on the cluster (scripts/cluster.sh up --slurm).
for c in slurmctld slurmd srun munged; do
  command -v $c > /dev/null ||
    { echo "SKIP: no '$c' here (scripts/install_deps.sh installs slurmctld, slurmd, slurm-client and munge)"; exit 77; }
done
write_train_config
up s2x2 2 2 --slurm
S=$C

# srun places rank r on host r / 2 (block distribution), hostnames as in check_placement.
out=$(timeout 60 "$S/srun" -N 2 -n 4 sh -c \
  'echo "$SLURM_PROCID $(hostname) $(sed -n "s/^Cpus_allowed_list:\s*//p" /proc/self/status)"' 2>&1) ||
  die "srun hostname: $out"
for r in 0 1 2 3; do
  read -r host cpus <<<"$(echo "$out" | awk -v r=$r '$1 == r { print $2, $3 }')"
  [ "$host" = "${S##*/}-h$((r / 2))" ] || die "srun: rank $r runs on '$host', expected ${S##*/}-h$((r / 2))"
  wcpus=$(awk -v h="$host" '$1 == h { print $5 }' "$S/hosts")
  [ "$wcpus" = all ] && wcpus=$(sed -n 's/^Cpus_allowed_list:\s*//p' /proc/self/status)
  [ "$(cpu_ids "$cpus")" = "$(cpu_ids "$wcpus")" ] || die "srun: rank $r on $host runs on cpus '$cpus', expected '$wcpus'"
done
echo "srun placement: 4 ranks, 2 per host, hostnames equal within a host and different across; each on its host's cpus"

before=$(link_bytes "$S")
timeout 240 "$S/srun" -N 2 -n 4 --mpi=pmix "$MOE" check --json check.json || die "srun --mpi=pmix moe check failed"
check_traffic "$before" "$(link_bytes "$S")" 100000

# The batch script users adapt: stopped at step 3, then re-submitted (it resumes by itself), against a
# straight run under the cluster's mpirun.
timeout 120 "$S/mpirun" -np 4 "$MOE" train c.yml checkpoint_dir=m > m.log 2>&1 || { tail m.log; die "mpirun moe train failed"; }
for extra in --until=3 ""; do
  MOE=$MOE CONFIG=$PWD/c.yml KEYS="" CKPT_DIR=$PWD/sb timeout 180 "$S/sbatch" --wait --chdir="$PWD" \
    --output="$PWD/sbatch-%j.out" "$SRC/scripts/slurm_train.sbatch" $extra > sbatch.log 2>&1 ||
    { cat sbatch.log sbatch-*.out; die "sbatch scripts/slurm_train.sbatch $extra failed"; }
done
grep -h "moe-train:" sbatch-*.out
[ "$(grep -c "(resuming)" sbatch-*.out | awk -F: '{ s += $NF } END { print s }')" = 1 ] ||
  die "the second batch job did not resume"
cmp -s "$(tensor_bytes m/ckpt-00000006.safetensors)" "$(tensor_bytes sb/ckpt-00000006.safetensors)" ||
  die "sbatch (3 steps, then resumed) differs from the straight mpirun run at step 6"
echo "sbatch scripts/slurm_train.sbatch, stopped at step 3 and re-submitted: step 6 bit-identical to mpirun"
