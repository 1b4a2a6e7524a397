// Shared state of the multi-rank tests (run under mpirun): the world
// communicator made once by main(), and seeded payload helpers.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>

#include "moe/comm.h"
#include "moe/config.h"

namespace moe::testing {

Communicator& world();

// Sets environment variable `name` for the scope (empty: unset), restores it after. Set alike on
// every rank where the code under test decides collectively.
class ScopedEnv {
 public:
  ScopedEnv(std::string name, const std::string& v) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) old_ = old, had_ = true;
    if (v.empty()) unsetenv(name_.c_str());
    else setenv(name_.c_str(), v.c_str(), 1);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_.c_str(), old_.c_str(), 1);
    else unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_, old_;
  bool had_ = false;
};

// A float that depends only on (rank, index, salt): the same on every rank
// that computes it, varied in magnitude so sums are order-sensitive.
float seeded_float(int rank, int64_t index, uint32_t salt);

// The small bf16 layer the multi-rank layer tests share (E=8, K=2, D=16,
// F=12, both aux losses on so the router gradient has every term).
inline Config small_layer_config() {
  Config c;
  c.num_experts = 8;
  c.num_experts_per_tok = 2;
  c.emb_dim = 16;
  c.moe_mlp_dim = 12;
  c.dtype = DType::bf16;
  c.load_balance_loss_weight = 0.01;
  c.router_z_loss_weight = 0.001;
  return c;
}

}  // namespace moe::testing
