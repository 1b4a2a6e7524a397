// The one problem every `moe check` variant solves: a layer config, weights
// and inputs, identical on every rank (each rank builds it alone, no
// communication), and the results of one step gathered whole on the root.
#pragma once

#include <array>
#include <string>
#include <utility>
#include <vector>

#include "moe/comm.h"
#include "moe/config.h"
#include "moe/layer.h"

namespace moe::check {

struct Problem {
  Config base;           // layer config, parallelism 1
  LayerWeights weights;  // separate wi_0 / wi_1, as init_weights stores them
  Tensor x, dy;          // [T, D] f32, the global batch in token order
};

// Weights from init_weights(base, seed); x and dy from the case registry's
// generator (bench::case_inputs) for T tokens of base's shapes.
Problem make_problem(const Config& base, int64_t tokens, uint64_t seed);

// The same weights in the layout `cfg` uses: wi_0/wi_1 as they are, or the
// prefused wi [E, D, 2F] = [wi_0 | wi_1] along the last dim, or its split
// reshape [2, E, D/2, 2F] (SPEC.md §5).
LayerWeights weights_for(const Config& cfg, const LayerWeights& unfused);

// Whole results of one step, on the root.
struct StepTensors {
  // "y", "grad.x", then "grad.<weight name>" in file order.
  std::vector<std::pair<std::string, Tensor>> tensors;
  double loss = 0;                              // sum(y * dy) + lb + zl, f64
  std::array<int64_t, kNumCollKinds> counts{};  // collective calls of forward + backward
};

// Packs a step's results (y, dx: [T, D]; grads as stored) with its loss.
StepTensors collect(const Config& cfg, const Tensor& y, const Tensor& dx, const LayerWeights& grads,
                    const LayerOutputs& out, const Tensor& dy);

// The single-process layer (layer_forward / layer_backward) on the whole batch.
StepTensors reference_step(const Config& cfg, const Problem& p);

}  // namespace moe::check
