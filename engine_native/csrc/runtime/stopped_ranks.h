// Which ranks of this machine are stopped, for the failure paths' messages: a rank that waited
// HVD_TIMEOUT for a peer names the one that is stopped (SIGSTOP, a debugger), which may not
// be the peer it waited for (that peer may itself wait for the stopped one). Any thread; read
// only when a wait failed (one /proc read per rank of this machine).
#pragma once

#include <string>

#include "common/process_state.h"
#include "transport/mesh.h"

namespace hvd::runtime {

// common::processState of `rank` where its pid means a process here: the same kernel and pid
// namespace (as hvdrun, the notebook and Spark start ranks; containers on one node share the
// kernel, not the pids), else '\0'.
inline char processStateHere(const transport::Mesh& mesh, int rank) {
  const transport::PeerInfo& peer = mesh.peerInfo(rank);
  const transport::PeerInfo& self = mesh.peerInfo(mesh.rank());
  const bool pids_shared = peer.machine_id == self.machine_id &&
                           !peer.pid_namespace.empty() &&
                           peer.pid_namespace == self.pid_namespace;
  return pids_shared ? common::processState(peer.pid) : '\0';
}

inline std::string rankAndPid(const transport::Mesh& mesh, int rank) {
  return "rank " + std::to_string(rank) + " (pid " + std::to_string(mesh.peerInfo(rank).pid) +
         ")";
}

// "rank R (pid P) is stopped (SIGSTOP or a debugger)".
inline std::string stoppedRankText(const transport::Mesh& mesh, int rank) {
  return rankAndPid(mesh, rank) + " is stopped (SIGSTOP or a debugger)";
}

// "; <stoppedRankText>" for each other rank of this machine that is stopped now, but none that
// `said` already names as "rank R (pid P)"; "" when none. Stopped: 'T' (a signal), not 't' (a
// tracer's stop: strace and py-spy hold a live rank for moments; one read cannot tell them
// from a debugger's breakpoint, which awaitCause tells by its lasting).
inline std::string stoppedRanksNote(const transport::Mesh& mesh, const std::string& said) {
  std::string note;
  for (int r = 0; r < mesh.size(); ++r) {
    if (r == mesh.rank() || said.find(rankAndPid(mesh, r)) != std::string::npos) continue;
    if (processStateHere(mesh, r) == 'T') note += "; " + stoppedRankText(mesh, r);
  }
  return note;
}

}  // namespace hvd::runtime
