#include "check/dist_step.h"

#include "moe/comm_tensor.h"
#include "moe/dist_layer.h"
#include "moe/dist_runtime.h"
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
  // With offload targets the runtime owns the mesh, the side engine and its
  // communicators; without, a plain mesh (the layer's default path).
  std::unique_ptr<DistRuntime> rt;
  std::unique_ptr<Mesh> own_mesh;
  std::unique_ptr<DistLayer> layer_ptr;
  if (!cfg.moe_offload_targets.empty()) {
    rt = std::make_unique<DistRuntime>(cfg, comm, /*training=*/true);
    layer_ptr = std::make_unique<DistLayer>(cfg, *rt);
  } else {
    own_mesh = std::make_unique<Mesh>(comm, check_parallel_config(cfg, comm.size()));
    layer_ptr = std::make_unique<DistLayer>(cfg, *own_mesh, explicit_plan);
  }
  DistLayer& layer = *layer_ptr;
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
