// The memory one rank needs (include/moe/memory_estimate.h). Every term is a
// tensor the code allocates, named by where: src/layer/moe_layer.cpp and
// src/layer/expert_ffn.cpp (the layer), src/route/router.cpp, src/distributed/ (the
// distributed layer's buffers), src/train/ (the stack and its state).
#include "moe/memory_estimate.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "moe/dtype.h"
#include "moe/layer.h"

namespace moe {
namespace {

using LD = long double;

struct Axes {
  int64_t data = 1, fsdp = 1, expert = 1;
};

// a * b, or INT64_MAX where it overflows (a parallelism key can be any int64; the mesh check
// reports a product that does not match the world).
int64_t mul_saturated(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

// The parallelism keys with a -1 resolved against `ranks` (1 when unknown or not divisible).
Axes resolve_axes(const Config& c, int64_t ranks) {
  Axes a{c.data_parallelism, c.fsdp_parallelism, c.expert_parallelism};
  int64_t* rest = nullptr;
  int64_t known = 1;
  for (int64_t* v : {&a.data, &a.fsdp, &a.expert}) {
    if (*v == -1 && !rest)
      rest = v;
    else
      known = mul_saturated(known, std::max<int64_t>(*v, 1));
  }
  if (rest) *rest = ranks > 0 && known > 0 && ranks % known == 0 ? std::max<int64_t>(ranks / known, 1) : 1;
  for (int64_t* v : {&a.data, &a.fsdp, &a.expert}) *v = std::max<int64_t>(*v, 1);
  return a;
}

std::string gib(LD b) {
  std::ostringstream os;
  os.precision(3);
  os << b / (1024.0L * 1024.0L * 1024.0L) << " GiB";
  return os.str();
}

}  // namespace

std::string MemoryEstimate::describe() const {
  std::string s = "expert weights " + gib(weights);
  if (train_state > 0) s += ", training state " + gib(train_state);
  s += ", activations " + gib(activations) + " (" + std::to_string(tokens) + " tokens, " +
       std::to_string(ffn_rows) + " expert rows per layer)";
  if (buffers > 0) s += ", distributed-layer buffers " + gib(buffers);
  return s;
}

std::string StepMinimum::describe() const {
  auto mib = [](long double b) {
    std::ostringstream os;
    os.setf(std::ios::fixed);
    os.precision(1);
    os << b / (1024.0L * 1024.0L) << " MiB";
    return os.str();
  };
  return "weights " + mib(weights) + " + copies " + mib(weight_copies) + " + gradients " + mib(gradients) +
         " + saved " + mib(saved) + " + io " + mib(step_io) + " + comm " + mib(comm) +
         (optimizer > 0 ? " + optimizer/teacher " + mib(optimizer) : std::string()) + " = " + mib(total());
}

namespace {
// xs_written: the permuted rows xs are saved (else the permute's index, layer_permutes_in_gemm).
StepMinimum minimum_of(const Config& c, int64_t tokens, DType x_dtype, DType router_dtype, bool xs_written) {
  StepMinimum m;
  const LD T = LD(std::max<int64_t>(tokens, 0)), K = LD(c.num_experts_per_tok), E = LD(c.num_experts),
           D = LD(c.emb_dim), F = LD(c.moe_mlp_dim);
  const LD s = LD(dtype_size(c.dtype)), sw = LD(dtype_size(c.weight_dtype)),
           sr = LD(dtype_size(router_dtype));
  const LD sx = LD(dtype_size(x_dtype));
  const LD R = T * K;
  const LD experts = E * 3 * D * F;  // wi_0 + wi_1 (or wi) + wo
  m.weights = experts * sw + E * D * sr;
  m.weight_copies =
      (sw != s || c.weight_dtype != c.dtype ? experts * s : 0) + (router_dtype != DType::f32 ? E * D * 4 : 0);
  m.gradients = (experts + E * D) * 4;
  // x in the compute dtype, kept for the router's backward and the gathered rows (the caller's x
  // itself when it is given in the compute dtype: counted in step_io), the router's logits and scores,
  // top-k ids, scores and weights; the permuted rows xs (or their index), the up projection h [R, 2F],
  // the gated a [R, F] and the expert outputs ys [R, D].
  const bool x_is_layer_input = x_dtype == c.dtype;
  m.saved = (x_is_layer_input ? 0 : T * D * s) + 2 * T * E * 4 + 3 * T * K * 4 +
            (xs_written ? R * D * s : R * 4) + R * 2 * F * s + R * F * s + R * D * s;
  // x and dy as given, y in the compute dtype, dx (f32).
  m.step_io = T * D * sx * 2 + T * D * s + T * D * 4;
  return m;
}
}  // namespace

StepMinimum step_minimum(const Config& c, int64_t tokens, DType x_dtype, DType router_dtype) {
  return minimum_of(c, tokens, x_dtype, router_dtype, !layer_permutes_in_gemm(c));
}

uint64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : 0;
}

int64_t tokens_per_rank(const Config& c, int64_t ranks) {
  const Axes a = resolve_axes(c, ranks);
  const int64_t n = ranks > 0 ? ranks : mul_saturated(mul_saturated(a.data, a.fsdp), a.expert);
  return std::max<int64_t>(c.batch_tokens, 1) / n + (std::max<int64_t>(c.batch_tokens, 1) % n != 0);
}

MemoryEstimate estimate_memory(const Config& c, int64_t tokens, int64_t ranks, bool train_stack) {
  MemoryEstimate m;
  const Axes ax = resolve_axes(c, ranks);
  const LD T = LD(std::max<int64_t>(tokens, 0)), K = LD(c.num_experts_per_tok), E = LD(c.num_experts),
           D = LD(c.emb_dim), F = LD(c.moe_mlp_dim), ep = LD(ax.expert);
  const LD s = LD(dtype_size(c.dtype)), sw = LD(dtype_size(c.weight_dtype));
  const LD El = std::ceil(E / ep);  // experts this rank computes
  const LD R = T * K;               // routed rows of this rank's tokens
  const bool ring = c.use_ring_of_experts && ax.expert > 1;
  const bool a2a = !c.use_ring_of_experts && ax.expert > 1;
  // Rows the FFN runs on: the all-to-all's receive buffer (ragged_buffer_rows in src/comm/ep_plan.cpp:
  // R * factor, or R * min(EP, E / K) for the worst case), the ring's gathered tokens' rows, or R.
  LD Rf = R;
  if (a2a) Rf = c.ragged_buffer_factor > 0 ? R * LD(c.ragged_buffer_factor) : R * std::min(ep, E / K);
  if (ring) Rf = R * ep;
  const LD Tg = ring ? T * ep : T;  // tokens the combine and router backward see
  m.tokens = tokens;
  m.ffn_rows = int64_t(std::min<LD>(Rf, 9e18L));

  const LD expert_weights = El * 3 * D * F;  // wi_0, wi_1, wo of the local experts
  // The weights: stored dtype, plus the FSDP shard the gathered copy comes from, plus the f32 router.
  m.weights = expert_weights * sw * (ax.fsdp > 1 ? 1 + 1 / LD(ax.fsdp) : 1) + E * D * 4;
  if (train_stack) m.weights = expert_weights * s;  // the compute-dtype copy of one layer (the state is f32)

  // One layer's forward, kept for its backward (LayerForward, the dist Chunk):
  const LD saved = T * D * s        // x in the compute dtype
                   + E * D * 4      // the router kernel in f32 (x above is the router's input too)
                   + 2 * T * E * 4  // logits, scores
                   + 3 * T * K * 4  // top-k ids, scores, weights
                   + 3 * R * 4      // routing: sorted ids, positions, group offsets
                   + (dist_permutes_in_gemm(c, ax.expert) ? R * 4 : R * D * s)  // xs, or its index
                   + Rf * 3 * F * s  // h0, h1 (or fused h), gated a
                   + Rf * D * s      // expert outputs ys
                   + T * D * s;      // the layer output y
  // One layer's backward at its peak (layer_backward, ffn_backward_data, ffn_weight_grads):
  const LD work = T * D * s             // dy in the compute dtype
                  + Rf * D * s * 2      // dys, dxs
                  + Tg * K * 4          // d(weights)
                  + Rf * 3 * F * s      // da, dh0, dh1
                  + Rf * D * 4 * 2      // the f32 partial input gradient p0 (the second product is
                                        // added to it in the tiles since 2026-12-05) and one more
                                        // [R, D] f32: with p0 alone the bf16 layer's measured peak
                                        // is 2.5% above the estimate (docs/reliability.md)
                  + expert_weights * 4  // the experts' weight gradients (f32)
                  + E * D * 4           // the router's gradient
                  + T * D * 4           // x^T in f32, packed by the router's kernel gradient (that call only)
                  + Tg * D * 4 + Tg * E * 4;  // dx, dz
  // The distributed layer's own buffers per layer: kept (the sorted received rows, or the gathered
  // tokens and routing) and, for one layer at a time, the transfers in flight.
  LD kept_buffers = 0, transient_buffers = 0;
  if (a2a) {
    kept_buffers = Rf * D * s;                       // xl: the received rows in expert order
    transient_buffers = 2 * Rf * D * s + R * D * s;  // receive buffer, unsorted return, returned rows
  }
  if (ring) {
    kept_buffers = Tg * D * s + Tg * K * 12;  // gathered tokens and routing
    transient_buffers = 2 * Tg * D * 4;       // the f32 partial output and the gathered dx
  }

  const LD layers = train_stack ? LD(std::max<int64_t>(c.num_layers, 1)) : 1;
  m.activations = layers * saved + work;
  m.buffers = (a2a || ring) ? layers * kept_buffers + transient_buffers : 0;
  if (train_stack) {
    // Per block: the norm's input, its f32 output and 1/rms (src/train/rmsnorm.cpp); the step's
    // inputs, the teacher's target and the residual stream, and the loss gradient.
    m.activations += layers * (2 * T * D * 4 + T * 4) + 4 * T * D * 4;
    // Teacher, parameters, gradients, AdamW m and v: five f32 copies of every block's
    // parameters (router, local experts, norm scale; src/train/step.cpp).
    m.train_state = 5 * layers * (expert_weights * 4 + E * D * 4 + D * 4);
  }
  return m;
}

StepMinimum train_step_minimum(const Config& c, int64_t tokens, int64_t ranks) {
  const Axes ax = resolve_axes(c, ranks);
  Config local = c;
  local.num_experts = int64_t(std::ceil(LD(c.num_experts) / LD(ax.expert)));  // this rank's experts
  local.weight_dtype = DType::f32;                                            // the f32 parameters
  // The distributed layer's steps (moe train) write xs unless no rows move (dist_permutes_in_gemm).
  const bool xs_written = !dist_permutes_in_gemm(c, ax.expert);
  const StepMinimum one = minimum_of(local, tokens, DType::f32, DType::f32, xs_written);
  const LD L = LD(std::max<int64_t>(c.num_layers, 1)), T = LD(std::max<int64_t>(tokens, 0)),
           D = LD(c.emb_dim);
  StepMinimum m;
  m.weights = L * (one.weights + D * 4);  // + the norm scale
  m.weight_copies = L * one.weight_copies;
  m.gradients = L * (one.gradients + D * 4);
  // Every layer's saved tensors (router scores etc. use the full E: the router is replicated) and its
  // norm's input, f32 output and 1/rms (src/train/rmsnorm.cpp).
  m.saved = L * (minimum_of(c, tokens, DType::f32, DType::f32, xs_written).saved + 2 * T * D * 4 + T * 4);
  m.step_io = 4 * T * D * 4;    // the inputs, the teacher's target, the residual stream, the loss gradient
  m.optimizer = 3 * m.weights;  // AdamW m and v, the teacher
  m.comm = estimate_memory(c, tokens, ranks, true).buffers;
  return m;
}

std::vector<std::string> memory_problems(const Config& c, int64_t ranks, bool train_stack, uint64_t memory) {
  std::vector<std::string> out;
  if (c.num_experts <= 0 || c.num_experts_per_tok <= 0 || c.emb_dim <= 0 || c.moe_mlp_dim <= 0 || memory == 0)
    return out;
  const int64_t tokens = tokens_per_rank(c, ranks);
  const MemoryEstimate m = estimate_memory(c, tokens, ranks, train_stack);
  if (m.total() <= LD(memory)) return out;
  std::ostringstream os;
  os.precision(3);
  const LD total = m.total();
  os << (train_stack ? "moe train" : "one MoE layer's step") << " needs about ";
  if (total < 9.2e18L)
    os << uint64_t(total) << " bytes (" << gib(total) << ")";
  else
    os << total << " bytes";
  os << " on each rank (" << m.describe() << "; batch_tokens=" << c.batch_tokens
     << (train_stack ? ", num_layers=" + std::to_string(c.num_layers) : std::string())
     << ", emb_dim=" << c.emb_dim << ", moe_mlp_dim=" << c.moe_mlp_dim << ", num_experts=" << c.num_experts
     << ", num_experts_per_tok=" << c.num_experts_per_tok << "), but this machine has " << memory
     << " bytes of memory (" << gib(LD(memory)) << ")";
  out.push_back(os.str());
  return out;
}

}  // namespace moe
