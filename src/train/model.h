// The trained model: a stack of num_layers pre-norm residual MoE blocks,
//   h <- h + MoE(RMSNorm(h)),
// with f32 master parameters (whatever weight_dtype says; the layer casts to
// the compute dtype). Parameter names follow SPEC.md §7 under `layers.{i}.`,
// plus `layers.{i}.norm.scale` [D].
#pragma once

#include <string>
#include <vector>

#include "moe/config.h"
#include "moe/dist_layer.h"
#include "moe/layer.h"
#include "moe/trace.h"

namespace moe::train {

struct Block {
  LayerWeights moe;   // f32
  Tensor norm_scale;  // [D] f32
};

struct Model {
  std::vector<Block> blocks;
};

// One named parameter of a model. `decay`: AdamW weight decay applies
// (matrices yes, norm scales no).
struct Param {
  std::string name;
  Tensor* tensor;
  bool decay;
};

// Student or teacher: layer i's MoE weights from init_weights keyed by
// (seed, i), converted to f32; norm scales = 1.
Model init_model(const Config& cfg, uint64_t seed);
// A model of the same names and shapes, all zeros (gradients, moments).
Model zeros_like(const Config& cfg, const Model& m);
// Every parameter in a fixed order: per layer, the MoE weights in file order, then norm.scale.
std::vector<Param> parameters(const Config& cfg, Model& m);
std::vector<std::pair<std::string, Shape>> parameter_shapes(const Config& cfg);

// Wall time of the phases of a step, in milliseconds (accumulated). The MoE
// layer is timed as a whole around layer_forward / layer_backward.
struct PhaseTimes {
  double data = 0, teacher = 0, norm = 0, moe_forward = 0, moe_backward = 0, optimizer = 0;
  double total = 0;
};

// Per-layer routing statistics of one forward. Under the distributed layer
// `rows` and `dropped` are this rank's (the step sums them over ranks, then
// sets load_max / load_mean: set_load).
struct LayerStats {
  float lb = 0, z = 0;       // weighted aux losses (global)
  int64_t dropped = 0;       // slots dropped by capacity
  std::vector<double> rows;  // [E] rows kept per expert
  double load_max = 0;       // most rows any expert got
  double load_mean = 0;      // rows kept / E
};

// load_max and load_mean from s.rows.
void set_load(LayerStats& s);

// How a block's MoE layer runs: the single-process layer_forward (dist null)
// on whole weights, or the distributed layer on this rank's shards and rows.
// trace (optional): the layer's ops are recorded there.
struct LayerExec {
  const DistLayer* dist = nullptr;
  StepTrace* trace = nullptr;
};

// Forward only (the teacher): x [T, D] f32 -> h_L [T, D] f32.
Tensor model_forward(const Config& cfg, const Model& m, const Tensor& x, const LayerExec& exec = {});

struct LossTerms {
  double mse_sum = 0;    // sum of squared errors over this process's elements
  double lb = 0, z = 0;  // sums over layers of the weighted aux losses
  std::vector<LayerStats> layers;
};

// Forward and backward of loss = sse / (global_tokens * D) + sum of aux losses
// on this process's tokens x [T, D] against target [T, D]. Writes gradients
// into `grads` (same structure as m, overwritten).
// Under a distributed exec, m and grads hold this rank's shards (MoE gradients
// come back reduced to the shard; norm-scale gradients are this rank's partial sums).
LossTerms loss_and_grads(const Config& cfg, const Model& m, const Tensor& x, const Tensor& target,
                         int64_t global_tokens, Model& grads, PhaseTimes& times, const LayerExec& exec = {});

}  // namespace moe::train
