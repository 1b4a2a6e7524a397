#include "moe/trace_gather.h"

#include <string>

namespace moe {

std::vector<TraceOp> gather_trace_ops(Communicator& comm, const std::vector<TraceOp>& mine, int root) {
  const std::string bytes = serialize_ops(mine);
  const uint64_t n = bytes.size();
  const size_t W = size_t(comm.size());
  std::vector<uint64_t> sizes(W);
  comm.gatherv(&n, sizeof n, sizes.data(), std::vector<size_t>(W, sizeof n), root);
  std::vector<size_t> recv(sizes.begin(), sizes.end());
  size_t total = 0;
  for (size_t s : recv) total += s;
  std::string all(comm.rank() == root ? total : 0, '\0');
  comm.gatherv(bytes.data(), bytes.size(), all.data(), recv, root);
  return comm.rank() == root ? parse_ops(all) : std::vector<TraceOp>();
}

}  // namespace moe
