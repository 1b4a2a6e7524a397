// Fuzzes the metrics reader of `moe report` from the text of a metrics file
// (JSON lines), and draws the SVG of every file it accepts.
#include <sstream>
#include <string>

#include "fuzz_common.h"
#include "moe/error.h"
#include "train/report.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in{std::string(moe::fuzz::as_text(data, size))};
  try {
    moe::train::MetricsSeries s = moe::train::read_metrics(in, "fuzz.jsonl");
    (void)moe::train::render_report_svg(s, "fuzz.jsonl");
  } catch (const moe::Error&) {
  }
  return 0;
}
