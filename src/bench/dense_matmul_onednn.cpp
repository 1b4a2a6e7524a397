#include "bench/dense_matmul_onednn.h"

#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>

namespace moe::bench {

void dense_set_threads(int threads) { omp_set_num_threads(threads); }

struct DenseMatmul::Impl {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  dnnl::matmul mm;
  std::unordered_map<int, dnnl::memory> args;
};

DenseMatmul::DenseMatmul(int64_t M, int64_t K, int64_t N, DType in)
    : impl_(std::make_unique<Impl>()), flops_(2.0 * double(M) * double(K) * double(N)) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  dt t = in == DType::bf16 ? dt::bf16 : dt::f32;
  dnnl::memory::desc a_md({M, K}, t, tag::ab), b_md({K, N}, t, tag::ab), c_md({M, N}, t, tag::ab);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), impl_->eng);
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

void DenseMatmul::run() {
  impl_->mm.execute(impl_->strm, impl_->args);
  impl_->strm.wait();
}

}  // namespace moe::bench
