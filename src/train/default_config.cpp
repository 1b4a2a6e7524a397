// The embedded default config of `moe train`: a small Mixtral-like stack
// sized so the run takes about a minute on two cores (docs/training.md).
#include "moe/train.h"

namespace moe {

const char* default_train_config() {
  return R"(# moe train: embedded default config
num_experts: 8
num_experts_per_tok: 2
emb_dim: 64
moe_mlp_dim: 128
dtype: f32
num_layers: 2
steps: 8000
batch_tokens: 256
learning_rate: 0.01
warmup_steps: 50
min_lr_ratio: 0.1
weight_decay: 0.01
grad_clip: 1.0
seed: 0
teacher_seed: 1
log_period: 500
)";
}

}  // namespace moe
