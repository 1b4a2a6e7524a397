// Candidate layouts of `moe plan`, their ranking by predicted step time, the
// reasons the first wins, and the scaling sweep (docs/distributed.md, "Model
// of scale").
#pragma once

#include <string>
#include <vector>

#include "plan/step_model.h"

namespace moe::plan {

// Every mesh (expert | E, fsdp | D, data the rest) x chunks {1, 4} x ring (expert > 1) x offload
// {none, the targets that move something, all} x all-to-all {flat, hierarchical when the expert
// group spans hosts}.
std::vector<Layout> candidate_layouts(const LayerShape& L, const Cluster& cl);
// Predictions of the candidates, fastest first (ties: fewer side-engine targets, then name).
std::vector<Prediction> rank_layouts(const LayerShape& L, const Cluster& cl, const Rates& r,
                                     const std::vector<Layout>& candidates, const ModelOptions& o = {});
// The largest terms of a prediction on the critical path: compute kinds and exposed communication.
std::vector<std::pair<std::string, double>> dominant_terms(const Prediction& p, size_t n);
// Why ranked[0] wins: its dominant terms and where it gains over ranked[1].
std::string explain_winner(const std::vector<Prediction>& ranked);
std::string format_prediction(const Prediction& p);  // one table row
std::string prediction_json(const Prediction& p, bool with_ops);

// One row of the sweep: the best layout at one (layer, hosts, link).
struct SweepRow {
  std::string layer;
  int hosts = 0;
  double inter_gbit = 0;
  Prediction best;
  double tokens_per_s = 0;    // hosts*ranks_per_host*T / step
  double gain = 0;            // tokens_per_s over the row with half the hosts (0 for the first)
  bool stops_paying = false;  // the first doubling whose gain is below 1.5x
};
struct SweepOptions {
  std::vector<int> hosts = {8, 16, 32, 64, 128, 256, 512, 1024};
  std::vector<double> inter_gbit = {10, 100};
  std::vector<double> inter_lat_us = {20, 5};  // per link speed
  double cores = 32;
  int ranks_per_host = 4;
};
std::vector<SweepRow> sweep(const std::vector<LayerShape>& layers, const Rates& r, const SweepOptions& o);
std::string format_sweep(const std::vector<SweepRow>& rows);

}  // namespace moe::plan
