#include "check/harness.h"
#include "distributed/mesh_variants.h"

#include <map>

#include "check/dist_step.h"
#include "check/problem.h"
#include "moe/dist_layer.h"

namespace moe::check {
namespace {

// Why `v` cannot run here, or "" when it can. Depends only on the config and
// the world size, so every rank decides alike.
bool not_implemented(const Error& e) {
  return std::string(e.what()).find("not implemented") != std::string::npos;
}

// Runs `v` on world ranks [0, n); returns rank 0's results, or sets `why`
// when the layer reports the feature as not implemented.
StepTensors run_members(const Config& cfg, const VariantSpec& v, Communicator& world, const Problem& p,
                        std::string& why) {
  const bool member = world.rank() < v.ranks();
  std::unique_ptr<Communicator> sub = world.split(member ? 0 : 1, world.rank());
  if (!member) return StepTensors();
  try {
    return distributed_step(cfg, v.explicit_plan, *sub, p);
  } catch (const Error& e) {
    if (!not_implemented(e)) throw;
    why = e.what();
    return StepTensors();
  }
}

int grads_total(const Config& cfg) { return 1 + int(weight_shapes(cfg).size()); }

}  // namespace

std::vector<VariantReport> run_check(const CheckOptions& o, Communicator& world,
                                     const std::function<void(const VariantReport&)>& on_report) {
  const Problem p = make_problem(o.base, o.tokens, o.seed);
  std::map<std::string, StepTensors> done;  // rank 0: results of the variants run
  std::vector<VariantReport> reports;
  for (const VariantSpec& v : select_variants(o.variants)) {
    const Config cfg = variant_config(o.base, v);
    std::string why = mesh_skip_reason(cfg, v, world.size());
    StepTensors got;
    if (why.empty()) got = run_members(cfg, v, world, p, why);
    if (world.rank() != 0) continue;
    VariantReport r;
    if (!why.empty()) {
      r = skipped(v, grads_total(cfg), why);
    } else {
      auto cp = done.find(v.counterpart);
      r = compare(v, got, reference_step(cfg, p), cp == done.end() ? nullptr : &cp->second);
      done[v.name] = std::move(got);
    }
    reports.push_back(r);
    if (on_report) on_report(r);
  }
  return reports;
}

}  // namespace moe::check
