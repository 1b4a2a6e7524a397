#include "bench/dense_matmul_onednn.h"

#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <utility>

#include "moe/error.h"

namespace moe::bench {

void dense_set_threads(int threads) { omp_set_num_threads(threads); }

struct DenseMatmul::Impl {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  dnnl::matmul mm;
  std::unordered_map<int, dnnl::memory> args;
  std::string kernel;
};

namespace {
// " (ONEDNN_MAX_CPU_ISA=AVX2)" when set, else "".
std::string max_isa_env() {
  const char* v = std::getenv("ONEDNN_MAX_CPU_ISA");
  return v ? std::string(" (ONEDNN_MAX_CPU_ISA=") + v + ")" : std::string();
}

// oneDNN's ISA values (feature bitmasks) by name; others in hex.
std::string onednn_isa_name(dnnl_cpu_isa_t isa) {
  static const std::pair<dnnl_cpu_isa_t, const char*> kNames[] = {
      {dnnl_cpu_isa_sse41, "sse41"},
      {dnnl_cpu_isa_avx, "avx"},
      {dnnl_cpu_isa_avx2, "avx2"},
      {dnnl_cpu_isa_avx2_vnni, "avx2_vnni"},
      {dnnl_cpu_isa_avx512_core, "avx512_core"},
      {dnnl_cpu_isa_avx512_core_vnni, "avx512_core_vnni"},
      {dnnl_cpu_isa_avx512_core_bf16, "avx512_core_bf16"},
      {dnnl_cpu_isa_avx512_core_amx, "avx512_core_amx"}};
  for (const auto& [value, name] : kNames)
    if (value == isa) return name;
  char hex[32];
  std::snprintf(hex, sizeof hex, "isa 0x%x", unsigned(isa));
  return hex;
}

// True when oneDNN may use native bf16 dot products (its ISA limit includes
// avx512_core_bf16); below it a bf16 matmul is emulated by widening to f32.
bool onednn_native_bf16(std::string& why) {
  const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  const unsigned bf16 = dnnl_cpu_isa_avx512_core_bf16;
  if ((unsigned(isa) & bf16) == bf16) return true;
  why = "oneDNN runs at " + onednn_isa_name(isa) + " here" + max_isa_env() +
        ", below avx512_core_bf16: no native bf16 matmul, so the baseline is oneDNN's f32 matmul of the same "
        "FLOPs";
  return false;
}

dnnl::matmul::primitive_desc matmul_pd(const dnnl::memory::desc& a, const dnnl::memory::desc& b,
                                       const dnnl::memory::desc& c, const dnnl::engine& eng, DType in) {
  try {
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), eng);
  } catch (const dnnl::error& e) {
    fail("oneDNN has no ", dtype_name(in), " matmul on this CPU", max_isa_env(), ": ", e.what());
  }
}
}  // namespace

DenseMatmul::DenseMatmul(int64_t M, int64_t K, int64_t N, DType in)
    : impl_(std::make_unique<Impl>()), flops_(2.0 * double(M) * double(K) * double(N)) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  dt t = in == DType::bf16 ? dt::bf16 : dt::f32;
  dnnl::memory::desc a_md({M, K}, t, tag::ab), b_md({K, N}, t, tag::ab), c_md({M, N}, t, tag::ab);
  dnnl::matmul::primitive_desc pd = matmul_pd(a_md, b_md, c_md, impl_->eng, in);
  impl_->kernel = pd.impl_info_str();
  impl_->mm = dnnl::matmul(pd);
  dnnl::memory a(a_md, impl_->eng), b(b_md, impl_->eng), c(c_md, impl_->eng);
  // Small finite values: 0x3c003c00 is 2^-7 in each bf16 half, ~0.0078 as f32.
  for (dnnl::memory* m : {&a, &b}) {
    auto* p = static_cast<uint32_t*>(m->get_data_handle());
    size_t words = m->get_desc().get_size() / 4;
    for (size_t i = 0; i < words; ++i) p[i] = 0x3c003c00u;
  }
  impl_->args = {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}};
}

DenseMatmul::~DenseMatmul() = default;
DenseMatmul::DenseMatmul(DenseMatmul&&) noexcept = default;

std::string DenseMatmul::kernel() const { return impl_->kernel; }

void DenseMatmul::run() {
  impl_->mm.execute(impl_->strm, impl_->args);
  impl_->strm.wait();
}

DenseMatmul dense_matmul_for(int64_t M, int64_t K, int64_t N, DType layer_dtype, DenseBaseline& chosen) {
  chosen.impl = "onednn";
  chosen.dtype = dense_compute_dtype(layer_dtype, chosen.why);
  if (chosen.dtype == DType::bf16 && !onednn_native_bf16(chosen.why)) chosen.dtype = DType::f32;
  if (chosen.dtype == DType::bf16) {
    try {
      DenseMatmul mm(M, K, N, DType::bf16);
      chosen.kernel = mm.kernel();
      return mm;
    } catch (const Error& e) {
      chosen.dtype = DType::f32;
      chosen.why = std::string(e.what()) + ", so the baseline is oneDNN's f32 matmul of the same FLOPs";
    }
  }
  DenseMatmul mm(M, K, N, chosen.dtype);
  chosen.kernel = mm.kernel();
  return mm;
}

}  // namespace moe::bench
