#!/bin/sh
# at_level.sh LEVEL MOE CMD [ARGS...]: runs CMD with MOE_GEMM_ISA=LEVEL (every rank of an mpirun
# inherits it), so the multi-rank bit-exact contracts are checked at each kernel level. Exits 77
# (CTest SKIP_RETURN_CODE) with the reason when this CPU (or build) lacks the level: MOE is asked
# first, since every moe command checks MOE_GEMM_ISA before it runs.
level=$1
moe=$2
shift 2
if ! why=$(MOE_GEMM_ISA=$level "$moe" --help 2>&1 >/dev/null) || [ -n "$why" ]; then
  echo "skipped: $why"
  exit 77
fi
MOE_GEMM_ISA=$level exec "$@"
