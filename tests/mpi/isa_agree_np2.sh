#!/bin/sh
# Every MPI rank runs the same kernel level (src/comm/mpi_comm.cpp, agree_on_isa).
# Usage: isa_agree_np2.sh MPIEXEC MOE MODE
#   lowest:    one rank forced to avx2 (MOE_GEMM_ISA), the other choosing its own: `moe info --json`
#              (printed by rank 0 only) reports avx2 and 2 ranks, whichever rank was forced.
#              Exits 77 (CTest skip) when this CPU or build has no avx2 level.
#   bad_level: rank 1 has MOE_GEMM_ISA=bogus: the job ends (no hang) with rank 1's message. The
#              moe binary checks MOE_GEMM_ISA before any command runs, so rank 1 exits before MPI
#              starts and mpirun ends the job; a library caller (no moe main) reaches the agreement
#              in mpi_comm.cpp instead, where rank 0 names rank 1.
set -u
mpiexec=$1 moe=$2 mode=$3
fail() { echo "isa_agree_np2: $*"; exit 1; }
mpmd() { timeout 60 "$mpiexec" --oversubscribe -np 1 $1 "$moe" info --json : -np 1 $2 "$moe" info --json 2>&1; }
case $mode in
lowest)
  if ! MOE_GEMM_ISA=avx2 "$moe" info >/dev/null 2>&1; then
    echo "isa_agree_np2: SKIP: this CPU (or build) has no avx2 kernel level: $("$moe" info | grep kernels)"
    exit 77
  fi
  for forced in 0 1; do
    if [ $forced = 0 ]; then out=$(mpmd "env MOE_GEMM_ISA=avx2" ""); else out=$(mpmd "" "env MOE_GEMM_ISA=avx2"); fi
    rc=$?
    echo "$out"
    [ $rc = 0 ] || fail "rank $forced forced to avx2: exit status $rc"
    echo "$out" | grep -q '"isa": "avx2"' || fail "rank $forced forced to avx2: the reported level is not avx2"
    echo "$out" | grep -q '"ranks": 2' || fail "rank $forced forced to avx2: not 2 ranks"
    [ "$(echo "$out" | grep -c '"ranks"')" = 1 ] || fail "printed by more than rank 0"
  done
  echo "isa_agree_np2: OK (avx2 on both ranks, whichever was forced)"
  ;;
bad_level)
  out=$(mpmd "" "env MOE_GEMM_ISA=bogus")
  rc=$?
  echo "$out"
  echo "exit status $rc"
  [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "expected a non-zero exit status (not the timeout's 124), got $rc"
  echo "$out" | grep -q 'MOE_GEMM_ISA=bogus names no kernel level' || fail "rank 1's own message is missing"
  echo "isa_agree_np2: OK (the job ended with rank 1's message)"
  ;;
*) fail "unknown mode '$mode'" ;;
esac
