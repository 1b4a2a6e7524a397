// `moe plan --calibrate`: measures the kernel rates of rates.h on this
// machine. Per layer shape and token count it steps a one-rank distributed
// layer (the same ops as every rank of a distributed step) with the step
// trace on, at one pool thread, and divides each op's useful work by its
// median time; then the pool's speedup at its full size, memcpy, the side
// engine's hand-off, and (under mpirun with >= 2 ranks) the shared-memory
// link's α and β with an all-to-all probe.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "moe/comm.h"
#include "plan/rates.h"
#include "plan/step_model.h"

namespace moe::plan {

struct CalibrateOptions {
  std::vector<LayerShape> shapes;  // T of each: the largest token count; also T/4 and T/16
  int iters = 3;
  int pool_threads = 0;  // 0: the compute pool's size when called
  std::function<void(const std::string&)> log;
};

// One process: the kernels, memcpy, the side engine's hand-off; the link is derived from memcpy
// (intra_measured false). Under mpirun (world of >= 2 ranks, collective): only the link's α and β,
// the contention row, and with every rank on a host of its own the network stack's CPU per byte
// (comm_cpu_ns_per_byte; 0 where not measured), the rest of the result left empty (rank 0's
// numbers are returned).
Rates calibrate(const CalibrateOptions& o, Communicator& world);

// The network stack's CPU per byte from an all-to-all probe between hosts: `busy_core_ms`, the busy
// time of one machine's cores per iteration (the probe's polite pass: the ranks sleep between polls,
// so what is busy is the kernel's packet work and the copies), spent on the bytes that `ranks`
// ranks on that machine (hosts may share a machine: network namespaces) each sent and received
// (`bytes_out` each way per rank) in that iteration. ns per byte sent.
double network_cpu_ns_per_byte(double busy_core_ms, int64_t bytes_out, int ranks);

// The contention probe's wait curve is measured again while its ranks ran unequal (calibrate.cpp,
// contention_probe): `measure()` returns an attempt with a `spread` (the slowest rank's compute over
// the mean rank's, >= 1); attempts run until one's spread is at most kCalmSpread or `attempts`
// ran, and the one with the smallest spread is returned (the first of equals). `spreads`, where
// given, lists every attempt's spread in order.
inline constexpr int kCurveAttempts = 3;
inline constexpr double kCalmSpread = 1.05;
template <class Measure>
auto calmest_attempt(const Measure& measure, int attempts = kCurveAttempts,
                     std::vector<double>* spreads = nullptr) {
  auto best = measure();
  if (spreads) spreads->assign(1, best.spread);
  for (int attempt = 1; attempt < attempts && best.spread > kCalmSpread; ++attempt) {
    auto next = measure();
    if (spreads) spreads->push_back(next.spread);
    if (next.spread < best.spread) best = std::move(next);
  }
  return best;
}

}  // namespace moe::plan
