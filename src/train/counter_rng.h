// A counter-based random generator: every value is a pure function of
// (key, index), so a batch of step s is the same whichever process draws it,
// in whatever order, and resuming at step s needs only the seeds and s.
#pragma once

#include <cmath>
#include <cstdint>

namespace moe::train {

// One round of the SplitMix64 finalizer: a bijective 64-bit mixer.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A stream key from up to three words (e.g. seed, purpose, step).
inline uint64_t stream_key(uint64_t a, uint64_t b, uint64_t c = 0) { return mix64(mix64(mix64(a) ^ b) ^ c); }

// Uniform in (0, 1] from 53 random bits.
inline double unit_open_low(uint64_t bits) { return (double(bits >> 11) + 1.0) * 0x1.0p-53; }

// Standard normal number `i` of stream `key` (Box-Muller on two counter draws).
inline float counter_normal(uint64_t key, uint64_t i) {
  const double u1 = unit_open_low(mix64(key + 2 * i)), u2 = unit_open_low(mix64(key + 2 * i + 1));
  return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

}  // namespace moe::train
