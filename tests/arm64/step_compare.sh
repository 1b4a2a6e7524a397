#!/bin/sh
# `moe step` on arm64 (under qemu-user) against the x86-64 build, same config, weights and inputs
# (written once by the x86 `moe init`), for a bf16 and an f32 layer:
#   reference on both            bit-exact (the same plain loops, same order of additions)
#   neon vs avx2                 bit-exact (the same FMA chain per output element, simd/gemm_impl.h)
#   neon_bf16 vs avx2            within TOL relative to each tensor's largest magnitude, and the
#                                same routing; only where the emulated CPU has BF16. TOL = 2^-8,
#                                one bf16 ulp of the largest value: BFDOT's round-to-odd additions
#                                move an f32 sum by ~2^-24 of sum|a*b| (GroupedGemm.
#                                Bf16DotRoundingIsMeasured), which flips a few bf16 outputs and
#                                hidden activations by one ulp; measured at -cpu max: 8.7e-4 (y),
#                                6.5e-4 (grad.x), the weight gradients 0.9e-4 to 2.2e-4
#                                (docs/architecture.md "AArch64")
# Usage: step_compare.sh "QEMU ARM64_MOE" HOST_MOE   (QEMU_CPU in the environment picks the model)
set -u
arm=$1 host=$2
here=$(dirname "$0")
TOL=${MOE_ARM64_BF16_TOL:-0.0039}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "step_compare: FAIL: $*"; exit 1; }
cmp_out() { /usr/bin/python3 "$here/compare_outputs.py" "$@"; }
levels=$($arm info --json | /usr/bin/python3 -c 'import json,sys; print(" ".join(json.load(sys.stdin)["isa_available"]))') ||
  fail "arm64 moe info failed"
host_levels=$("$host" info --json | /usr/bin/python3 -c 'import json,sys; print(" ".join(json.load(sys.stdin)["isa_available"]))')
echo "arm64 levels: $levels; x86 levels: $host_levels"
has() { case " $1 " in *" $2 "*) return 0 ;; esac; return 1; }
for dtype in bf16 f32; do
  cfg=$dir/$dtype.yml
  printf 'num_experts: 8\nnum_experts_per_tok: 2\nemb_dim: 64\nmoe_mlp_dim: 48\ndtype: %s\n' $dtype >"$cfg"
  "$host" init --config "$cfg" --out "$dir/w_$dtype.st" --seed 5 --inputs "$dir/in_$dtype.st" --tokens 96 >/dev/null ||
    fail "x86 moe init"
  step() {  # step WHO LEVEL OUT
    who=$1
    [ "$who" = arm ] && bin=$arm || bin=$host
    MOE_GEMM_ISA=$2 $bin step --config "$cfg" --weights "$dir/w_$dtype.st" --inputs "$dir/in_$dtype.st" \
      --out "$3" >/dev/null || fail "$who moe step at $2 ($dtype)"
  }
  echo "== $dtype layer: arm64 reference vs x86 reference (bit-exact)"
  step arm reference "$dir/a_ref.st"
  step host reference "$dir/h_ref.st"
  cmp_out "$dir/a_ref.st" "$dir/h_ref.st" --exact || fail "$dtype: reference differs"
  if has "$host_levels" avx2; then
    step host avx2 "$dir/h_avx2.st"
    echo "== $dtype layer: arm64 neon vs x86 avx2 (bit-exact)"
    step arm neon "$dir/a_neon.st"
    cmp_out "$dir/a_neon.st" "$dir/h_avx2.st" --exact || fail "$dtype: neon differs from avx2"
    if has "$levels" neon_bf16; then
      echo "== $dtype layer: arm64 neon_bf16 vs x86 avx2 (routing equal, floats within $TOL of each tensor's max)"
      step arm neon_bf16 "$dir/a_bf16.st"
      cmp_out "$dir/a_bf16.st" "$dir/h_avx2.st" --rel "$TOL" || fail "$dtype: neon_bf16 outside $TOL"
    else
      echo "(no neon_bf16 on this emulated CPU)"
    fi
  fi
done
echo "step_compare: OK"
