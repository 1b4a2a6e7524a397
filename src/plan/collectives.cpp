#include "plan/collectives.h"

#include <algorithm>
#include <cmath>

namespace moe::plan {

Group make_group(int size, int stride, int ranks_per_host) {
  Group g;
  g.size = std::max(size, 1);
  // Members i*stride: those on one host are the ones within ranks_per_host consecutive ranks.
  g.p_local = stride >= ranks_per_host ? 1 : std::clamp(ranks_per_host / stride, 1, g.size);
  if (g.size % g.p_local) g.p_local = 1;  // uneven placement: treat every member as remote
  // Groups that share a host: each host holds ranks_per_host ranks, p_local of them per group.
  g.sharing = std::max(1, ranks_per_host / g.p_local);
  return g;
}

const char* a2a_algo_name(A2AAlgo a) { return a == A2AAlgo::flat ? "flat" : "hierarchical"; }

namespace {
double inter_bw(const Group& g, const Link& inter) { return inter.bw_Bps / g.sharing; }
// An all-to-all whose ranks each send to more than one other host at once: the NIC at its
// many-streams bandwidth (Link::a2a_bw_Bps).
double inter_bw(const Group& g, const Link& inter, double remote_peers) {
  return (remote_peers > 1 ? inter.many_peers_bw() : inter.bw_Bps) / g.sharing;
}
// Every collective of more than one rank waits once for its slowest member (Link::sync_s).
Cost synced(Cost c, const Group& g, const Link& intra, const Link& inter) {
  if (g.size > 1) c.alpha_s += g.hosts() > 1 ? std::max(intra.sync_s, inter.sync_s) : intra.sync_s;
  return c;
}
}  // namespace

// Flat (pairwise exchange): P-1 messages of n/P; p_local-1 of them inside the host, P-p_local across.
// The host's p_local members of every one of the `sharing` groups send across at once: the NIC
// carries sharing·p_local members' bytes.
//   α: (p_local-1)·α_intra + (P-p_local)·α_inter
//   β: n(p_local-1)/P / β_intra + n(P-p_local)/P / (β_inter/(sharing·p_local))
// β_inter: the NIC's many-streams bandwidth where a rank has more than one remote peer.
Cost all_to_all(A2AAlgo algo, const Group& g, double n, const Link& intra, const Link& inter) {
  const double P = g.size, pl = g.p_local, h = g.hosts();
  Cost c;
  if (g.size == 1) return c;
  if (algo == A2AAlgo::flat || g.hosts() == 1) {
    c.alpha_s = (pl - 1) * intra.lat_s + (P - pl) * inter.lat_s;
    c.beta_s = n * (pl - 1) / P / intra.bw_Bps + (P > pl ? n * (P - pl) / P / (inter_bw(g, inter, P - pl) / pl) : 0);
    return synced(c, g, intra, inter);
  }
  // Hierarchical, as src/comm/hier_a2a.h runs it (Tutel's 2DH): (1) an exchange inside the host,
  // after which local rank l holds every row of its host bound for lane l of any host; (2) an
  // exchange on each lane (one rank per host): h-1 messages, each carrying p_local ranks' rows; the
  // host's p_local lanes (of each of the `sharing` groups) cross its NIC at once.
  //   α: (p_local-1)·α_intra + (h-1)·α_inter
  //   β: n(p_local-1)/p_local / β_intra + n(h-1)/h / (β_inter/(sharing·p_local)), β_inter many-streams
  //   where h > 2
  c.alpha_s = (pl - 1) * intra.lat_s + (h - 1) * inter.lat_s;
  c.beta_s = n * (pl - 1) / pl / intra.bw_Bps + n * (h - 1) / h / (inter_bw(g, inter, h - 1) / pl);
  return synced(c, g, intra, inter);
}

// Ring: P-1 steps of n bytes; a ring ordered host by host crosses each host boundary once, so a
// step spanning hosts is limited by the NIC (shared by the host's `sharing` rings).
//   one host: (P-1)(α_intra + n/β_intra); else (P-1)(α_inter + n/(β_inter/sharing))
Cost ring_all_gather(const Group& g, double n, const Link& intra, const Link& inter) {
  Cost c;
  const double steps = g.size - 1;
  const bool across = g.hosts() > 1;
  c.alpha_s = steps * (across ? inter.lat_s : intra.lat_s);
  c.beta_s = steps * n / (across ? inter_bw(g, inter) : intra.bw_Bps);
  return synced(c, g, intra, inter);
}

// Recursive doubling: ceil(log2 P) steps, the block doubling each time ((P-1)·n bytes in all).
// The last log2(h) steps cross hosts; every rank of the host then uses the NIC at once.
//   α: log2(p_local)·α_intra + log2(h)·α_inter
//   β: n(p_local-1)/β_intra + n·p_local(h-1)/(β_inter/(sharing·p_local))
Cost rd_all_gather(const Group& g, double n, const Link& intra, const Link& inter) {
  Cost c;
  if (g.size == 1) return c;
  const double pl = g.p_local, h = g.hosts();
  c.alpha_s = std::ceil(std::log2(pl)) * intra.lat_s + std::ceil(std::log2(h)) * inter.lat_s;
  c.beta_s = n * (pl - 1) / intra.bw_Bps + (h > 1 ? n * pl * (h - 1) / (inter.bw_Bps / (g.sharing * pl)) : 0);
  return synced(c, g, intra, inter);
}

Cost all_gather(const Group& g, double n, const Link& intra, const Link& inter) {
  Cost a = ring_all_gather(g, n, intra, inter), b = rd_all_gather(g, n, intra, inter);
  return a.total() <= b.total() ? a : b;
}

Cost ring_reduce_scatter(const Group& g, double n, const Link& intra, const Link& inter) {
  return ring_all_gather(g, n, intra, inter);
}

}  // namespace moe::plan
