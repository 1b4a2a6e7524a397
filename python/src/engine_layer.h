// The layer behind moe_engine.torch.MoELayer: a resolved config and either the single-process
// layer (layer_forward / layer_backward) or the distributed one (DistLayer over the world), with
// parameters passed in by the caller on every call (zero-copy views, docs/python.md).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "moe/comm.h"
#include "moe/config.h"
#include "moe/dist_layer.h"
#include "moe/dist_runtime.h"
#include "moe/layer.h"

namespace moe::python {

// The process's world communicator, made on first use (MPI when started by a launcher) and
// shared by every distributed layer.
std::shared_ptr<Communicator> world();
// The world if it was made, else null (no MPI started).
Communicator* world_if_made();

// Forward state kept for the backward (none under torch.no_grad).
struct ForwardState {
  LayerWeights weights;  // the views the forward read (keeps the caller's memory alive)
  DType x_dtype = DType::f32;
  LayerForwardPtr local;
  DistForwardPtr dist;
};

struct ForwardResult {
  Tensor y, topk_idx, topk_weights, group_sizes;
  // f32 values (exact in a double), or the f64 values of an f64 layer.
  double load_balance_loss = 0.0, z_loss = 0.0;
  int64_t dropped = 0;
  int64_t nonfinite_tokens = 0;         // all ranks (LayerOutputs::nonfinite_tokens)
  std::shared_ptr<ForwardState> state;  // null unless keep_state
};

class EngineLayer {
 public:
  // overrides: "key=value" config tokens; distributed: nullopt = when the world has several ranks
  // or a parallelism key is not 1. Collective over the world when distributed.
  EngineLayer(const std::vector<std::string>& overrides, std::optional<bool> distributed);
  ~EngineLayer();

  const Config& config() const { return cfg_; }
  const std::vector<ConfigEntry>& table() const { return table_; }
  bool distributed() const { return dist_ != nullptr; }
  // (SPEC name, shape) of this rank's parameters, in file order.
  const std::vector<std::pair<std::string, Shape>>& param_shapes() const { return shapes_; }

  // This rank's part of full weights (all of them on one process). Checks names and full shapes.
  std::map<std::string, Tensor> shard(const std::map<std::string, Tensor>& full) const;
  // Full weights from every rank's parts, on every rank (collective when distributed).
  std::map<std::string, Tensor> unshard(const std::map<std::string, Tensor>& parts) const;

  // x: [T, D] this rank's tokens; params: this rank's parameters by SPEC name.
  ForwardResult forward(const std::map<std::string, Tensor>& params, const Tensor& x, bool keep_state) const;
  // dx (x's dtype) and f32 parameter gradients by SPEC name (f64 for an f64 layer). The
  // single-process layer frees its saved tensors as it goes (the state is used once; an f64 layer
  // keeps them); `accumulate` (optional, single-process only): f32 gradients of every parameter to
  // add this step's into in place (BackwardOptions::accumulate), returned as the gradients.
  std::pair<Tensor, std::map<std::string, Tensor>> backward(const ForwardState& st, const Tensor& dy,
                                                            const AuxCotangents& aux,
                                                            const std::map<std::string, Tensor>& accumulate = {}) const;

  // Runs body; in a distributed layer any exception ends the whole job with its message
  // (run_collectively), as the CLI does.
  void collectively(const std::function<void()>& body) const;

 private:
  LayerWeights weights_of(const std::map<std::string, Tensor>& params) const;

  Config cfg_;
  std::vector<ConfigEntry> table_;
  std::vector<std::pair<std::string, Shape>> shapes_;
  std::shared_ptr<Communicator> world_;  // distributed only
  std::unique_ptr<DistRuntime> rt_;
  std::unique_ptr<DistLayer> dist_;
};

}  // namespace moe::python
