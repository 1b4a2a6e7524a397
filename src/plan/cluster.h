// The described cluster of `moe plan` (docs/distributed.md, "Model of
// scale"): hosts, cores and ranks per host, and the two links (within a host:
// shared memory; between hosts: the NIC, shared by the host's ranks).
#pragma once

#include <string>

namespace moe::plan {

// α–β link: a message of n bytes takes lat_s + n / bw_Bps.
struct Link {
  double bw_Bps = 0;  // bytes per second
  double lat_s = 0;   // seconds
  // Extra wait per collective for the slowest peer to arrive (ranks time-sliced on shared,
  // loaded cores: measured on this machine under mpirun; 0 on dedicated cores).
  double sync_s = 0;
  // Between hosts: the NIC's bandwidth for an all-to-all in which each rank sends to more than one
  // other host's ranks at once (many streams; on this machine's shaped veth links 20-25% below
  // one stream per pair of hosts); 0: bw_Bps.
  double a2a_bw_Bps = 0;
  double many_peers_bw() const { return a2a_bw_Bps > 0 ? a2a_bw_Bps : bw_Bps; }
};

struct Cluster {
  int hosts = 1;
  double cores = 2;  // per host
  int ranks_per_host = 1;
  Link intra;               // between ranks of one host (bw 0: take the calibrated one, with its sync)
  Link inter;               // one host's NIC (every rank of the host shares its bw)
  int threads = 0;          // compute-pool threads per rank (0: max(1, cores per rank))
  bool sync_given = false;  // sync= given (else: the rates file's on one host, 0 across hosts)
  int ranks() const { return hosts * ranks_per_host; }
  // Cores each rank gets; < 1 when ranks oversubscribe the host's cores.
  double cores_per_rank() const { return cores / ranks_per_host; }
};

// "hosts=16,cores=32,ranks_per_host=4,inter_bw=10Gbit,inter_lat=20us,intra_bw=20GB,intra_lat=2us[,threads=N][,sync=1ms][,inter_a2a_bw=8Gbit]".
// Bandwidths: a number with Gbit, Mbit, Kbit, bit, GB, MB, KB or B (per second; "/s" optional).
// Times: a number with s, ms, us or ns. Throws moe::Error naming the item and what was expected.
Cluster parse_cluster(const std::string& spec);
double parse_bandwidth(const std::string& item, const std::string& value);  // bytes per second
double parse_duration(const std::string& item, const std::string& value);   // seconds
std::string format_cluster(const Cluster& c);

}  // namespace moe::plan
