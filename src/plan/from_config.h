// The layer and layout of `moe plan` from a layer config, a bench case or a
// `moe bench --dist` variant.
#pragma once

#include <string>

#include "moe/config.h"
#include "plan/step_model.h"

namespace moe::plan {

// T: tokens per rank.
LayerShape shape_of(const Config& cfg, int64_t T, const std::string& name);
// Mesh, chunks, ring and live offload targets of the config (the mesh's -1 resolved against `ranks`).
Layout layout_of(const Config& cfg, int ranks, A2AAlgo a2a = A2AAlgo::flat);

}  // namespace moe::plan
