// The engine's one random generator, counter-based: every value is a pure
// function of (key, index), so it does not depend on which thread, rank or
// process draws it, in what order, or on the compute pool's size. A shard,
// a token slice or a resumed step draws exactly the values of the whole.
//
// Users: init_weights (src/layer/weights.cpp), `moe init --inputs`
// (tools/moe/cmd_init.cpp), `moe train`'s data and layer keys (src/train/),
// the case registry's inputs and forced routing (src/bench/cases.cpp: `moe
// bench`, `moe check`, the tests). The weights files `moe init` writes are
// defined by this code (docs/formats.md, "Random weights"): a change here
// changes them.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

#include "moe/tensor.h"

namespace moe {

// SplitMix64's step and finalizer: a bijective 64-bit mixer.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// --- Keys: one per stream of values ---

// A stream key from up to three words (e.g. seed, purpose, step).
inline uint64_t stream_key(uint64_t a, uint64_t b, uint64_t c = 0) { return mix64(mix64(mix64(a) ^ b) ^ c); }

// FNV-1a (64-bit) of a name.
inline uint64_t name_hash(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// The key of the tensor `name` drawn from `seed` (`moe init`'s weights and inputs).
inline uint64_t named_key(uint64_t seed, std::string_view name) { return mix64(seed) ^ name_hash(name); }

// --- Values of a stream ---

// Random word `i` of stream `key`.
inline uint64_t counter_bits(uint64_t key, uint64_t i) { return mix64(key ^ mix64(i)); }

// Uniform in (0, 1] from the top 53 bits (never 0: safe under log).
inline double unit_open_low(uint64_t bits) { return (double(bits >> 11) + 1.0) * 0x1.0p-53; }
// Uniform in [0, 1) from the top 53 bits.
inline double unit_open_high(uint64_t bits) { return double(bits >> 11) * 0x1.0p-53; }

// Uniform number `i` of stream `key`, in (0, 1]: unit_open_low of word i.
inline double counter_uniform(uint64_t key, uint64_t i) { return unit_open_low(counter_bits(key, i)); }

// Standard normal number `i` of stream `key`: Box-Muller on words 2i (radius,
// (0, 1]) and 2i + 1 (angle, [0, 1)), in double, rounded once to float.
inline float counter_normal(uint64_t key, uint64_t i) {
  const double u1 = unit_open_low(counter_bits(key, 2 * i)),
               u2 = unit_open_high(counter_bits(key, 2 * i + 1));
  return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

// --- Tensors ---

// t (f32, any shape) element j = std_dev * counter_normal(key, first + j), the
// product in float. Parallel over the compute pool; the same bits for any
// thread count.
void fill_normal(Tensor& t, uint64_t key, float std_dev = 1.0f, uint64_t first = 0);

// A new f32 tensor filled by fill_normal(t, key, std_dev).
Tensor normal_tensor(Shape shape, uint64_t key, float std_dev = 1.0f);

}  // namespace moe
