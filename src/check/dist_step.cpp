#include "check/dist_step.h"

#include "moe/comm_tensor.h"
#include "moe/dist_layer.h"
#include "moe/mesh.h"

namespace moe::check {
namespace {

std::array<int64_t, kNumCollKinds> read_counts(const CommCounters& c) {
  std::array<int64_t, kNumCollKinds> out{};
  for (int k = 0; k < kNumCollKinds; ++k) out[size_t(k)] = c.get(CollKind(k)).count;
  return out;
}

}  // namespace

StepTensors distributed_step(const Config& cfg, bool explicit_plan, Communicator& comm, const Problem& p) {
  Mesh mesh(comm, check_parallel_config(cfg, comm.size()));
  DistLayer layer(cfg, mesh, explicit_plan);
  LayerWeights shards = layer.shard(weights_for(cfg, p.weights));
  const int W = comm.size(), r = comm.rank();
  const int64_t T = p.x.dim(0), t0 = row_begin(T, r, W), t1 = row_begin(T, r + 1, W);
  comm.counters().reset();
  LayerOutputs out;
  DistForwardPtr f = layer.forward(shards, p.x.slice_rows(t0, t1), nullptr, out);
  LayerGrads g = layer.backward(*f, p.dy.slice_rows(t0, t1));
  const std::array<int64_t, kNumCollKinds> counts = read_counts(comm.counters());
  Tensor y = gather_rows(comm, out.y, 0), dx = gather_rows(comm, g.dx, 0);
  LayerWeights grads = layer.unshard_to_root(g.weights);
  if (r != 0) return StepTensors();
  StepTensors s = collect(cfg, y, dx, grads, out, p.dy);
  s.counts = counts;
  return s;
}

}  // namespace moe::check
