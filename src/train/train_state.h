// Everything a run carries from one step to the next: the parameters, the
// AdamW moments and the number of completed updates. The data and the teacher
// are pure functions of (seed, step) and teacher_seed, so this is the whole
// resumable state.
#pragma once

#include "train/model.h"

namespace moe::train {

struct TrainState {
  Model params;
  Model m;           // AdamW first moments, same names and shapes as params
  Model v;           // AdamW second moments
  int64_t step = 0;  // completed updates
};

// A fresh run: student weights from cfg.seed, zero moments, step 0.
TrainState fresh_state(const Config& cfg);

}  // namespace moe::train
