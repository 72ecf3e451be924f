// The record exchange the device path's set-up steps share, and C of Note [Device path choice]
// (device_path.cc): making a process set's NCCL communicator on every member, with every
// member's outcome shared. Background thread only, at the same point of the response order on
// every member (it is itself a collective over the set's CPU Comm).
#pragma once

#include <functional>
#include <vector>

#include "algo/algorithms.h"
#include "common/status.h"
#include "runtime/device_path.h"
#include "transport/comm.h"
#include "transport/nccl/device_stream.h"

namespace hvd::runtime {

// Every member's fixed-size record, in set-rank order.
template <typename T>
common::Status allgatherRecords(transport::Comm& comm, const T& mine, std::vector<T>* all) {
  all->resize(comm.size());
  std::vector<size_t> bytes(comm.size(), sizeof(T));
  return algo::allgatherRing(comm, &mine, all->data(), bytes);
}

// Ends a member's wait in NCCL set-up early (Note [Non-blocking set-up]): abort() here, or a
// peer gone (its cause, e.g. its own abort, follows by Note [Failure fan-out]).
std::function<common::Status()> setupInterruption(transport::Mesh& mesh);

// On success with out->nccl set, out->communicator is ready on every member; with it unset,
// out->why says why not, alike on every member (they stage). A non-OK Status is a core failure
// (Note [NCCL set-up outcome]).
common::Status createCommunicator(transport::Comm& comm,
                                  transport::nccl::DeviceStream& stream, PathChoice* out);

}  // namespace hvd::runtime
