// Which ranks of this machine are stopped, for the failure paths' messages: a rank that waited
// HVD_TIMEOUT for a peer names the one that is stopped (SIGSTOP, a debugger), which may not
// be the peer it waited for (that peer may itself wait for the stopped one). Any thread; read
// only when a wait failed (one /proc read per rank of this machine).
#pragma once

#include <string>

#include "common/process_state.h"
#include "transport/mesh.h"

namespace hvd::runtime {

// common::processState of `rank` where it shares this machine (its pid means the same process
// here: one pid namespace, as hvdrun, the notebook and Spark start ranks), else '\0'.
inline char processStateHere(const transport::Mesh& mesh, int rank) {
  const transport::PeerInfo& peer = mesh.peerInfo(rank);
  return peer.machine_id == mesh.peerInfo(mesh.rank()).machine_id
             ? common::processState(peer.pid)
             : '\0';
}

inline std::string rankAndPid(const transport::Mesh& mesh, int rank) {
  return "rank " + std::to_string(rank) + " (pid " + std::to_string(mesh.peerInfo(rank).pid) +
         ")";
}

// "rank R (pid P) is stopped (SIGSTOP or a debugger)".
inline std::string stoppedRankText(const transport::Mesh& mesh, int rank) {
  return rankAndPid(mesh, rank) + " is stopped (SIGSTOP or a debugger)";
}

// "; <stoppedRankText>" for each other rank of this machine that is stopped now ('T'), or
// "; rank R (pid P) is held by a tracer (...)" ('t': a debugger, or a profiler's moment), but
// none that `said` already names as "rank R (pid P)"; "" when none.
inline std::string stoppedRanksNote(const transport::Mesh& mesh, const std::string& said) {
  std::string note;
  for (int r = 0; r < mesh.size(); ++r) {
    if (r == mesh.rank() || said.find(rankAndPid(mesh, r)) != std::string::npos) continue;
    const char state = processStateHere(mesh, r);
    if (state == 'T') note += "; " + stoppedRankText(mesh, r);
    if (state == 't') {
      note += "; " + rankAndPid(mesh, r) + " is held by a tracer (a debugger, or a profiler's "
              "sample)";
    }
  }
  return note;
}

}  // namespace hvd::runtime
