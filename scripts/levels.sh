# Sourced by scripts/bench_levels.sh and scripts/bench_models.sh: oneDNN's ISA limit
# (ONEDNN_MAX_CPU_ISA) that matches an engine kernel level (MOE_GEMM_ISA); ALL for levels oneDNN
# names otherwise (the Arm ones).
onednn_isa() {
  case $1 in
    avx2) echo AVX2 ;;
    avx512) echo AVX512_CORE ;;
    avx512_bf16) echo AVX512_CORE_BF16 ;;
    *) echo ALL ;;
  esac
}
