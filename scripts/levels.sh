# Sourced by scripts/bench_levels.sh and scripts/bench_models.sh: oneDNN's ISA limit
# (ONEDNN_MAX_CPU_ISA) that matches an engine kernel level (MOE_GEMM_ISA); ALL for levels oneDNN
# names otherwise (the Arm ones).
onednn_isa() {
  case $1 in
    avx2) echo AVX2 ;;
    avx512) echo AVX512_CORE ;;
    avx512_bf16) echo AVX512_CORE_BF16 ;;
    amx_bf16) echo AVX512_CORE_AMX ;;
    *) echo ALL ;;
  esac
}

# The dense baseline is oneDNN under OpenMP. libgomp's threads spin after each parallel region
# (for ever with OMP_WAIT_POLICY=active), taking the cores from the engine's pool that runs next in
# the same process: measured with `GEMM_BENCH_OP`-free `build/gemm_bench 5 qwen`, the engine's
# up.gmm took 66 ms after an active-waiting dense call and 48 ms after a passive one, while the
# dense call itself ran at the same rate (669 against 677 GFLOP/s). Passive waits keep the
# comparison about the kernels; a user's environment setting wins.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
