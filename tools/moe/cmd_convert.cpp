// moe convert --to split|fused IN OUT: rewrites every `experts.wi` tensor of a
// weights (or checkpoint) file between the prefused [E, D, 2F] and the split
// [2, E, D/2, 2F] layout (SPEC.md §5). Bytes unchanged; OUT written atomically.
#include <cstdio>

#include "commands.h"
#include "io/convert.h"

namespace moe::cli {
namespace {
struct ConvertArgs {
  std::string to, in, out;
};

void run_convert(const ConvertArgs& a) {
  WiLayout to = a.to == "split" ? WiLayout::split : WiLayout::fused;
  std::vector<std::string> names = convert_wi_file(a.in, a.out, to);
  std::printf("moe convert: %zu tensor%s to the %s layout:", names.size(), names.size() == 1 ? "" : "s",
              wi_layout_name(to));
  for (const auto& n : names) std::printf(" %s", n.c_str());
  std::printf("\n  wrote %s\n", a.out.c_str());
}
}  // namespace

void add_convert(CLI::App& app) {
  auto a = std::make_shared<ConvertArgs>();
  CLI::App* c = app.add_subcommand(
      "convert",
      "Convert the expert weight `experts.wi` (and every `*.experts.wi`: stacked layers, optimizer\n"
      "moments) between the prefused layout [E, D, 2F] and the split layout [2, E, D/2, 2F].\n"
      "A pure reshape: the bytes are identical, only the shapes and the metadata key\n"
      "`moe.wi_layout` change. Other tensors and metadata are copied unchanged.");
  c->add_option("--to", a->to, "Target layout")->required()->check(CLI::IsMember({"split", "fused"}));
  c->add_option("IN", a->in, "Input .safetensors file")->required();
  c->add_option("OUT", a->out, "Output .safetensors file (written atomically; may equal IN)")->required();
  c->callback([a] { run_convert(*a); });
}

}  // namespace moe::cli
