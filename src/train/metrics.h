// The metrics file: one JSON object per step (JSON lines), flushed per line.
// Fields (docs/training.md): step, loss, mse, lb, z, lr, grad_norm, step_ms,
// tokens, tokens_per_s, dropped, collective_bytes, side_ops, load: [{max, mean}, ...].
#pragma once

#include <cstdio>
#include <string>

#include "moe/train.h"

namespace moe::train {

std::string metrics_json_line(const StepMetrics& m);

class MetricsWriter {
 public:
  // Opens `path` for appending after keeping only its lines with step <=
  // keep_through (0: truncate), creating its directory. An empty path writes nothing.
  MetricsWriter(const std::string& path, int64_t keep_through);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  void write(const StepMetrics& m);

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
};

}  // namespace moe::train
