// NcclCommunicator: one NCCL communicator for one process set on this rank, queuing collectives
// on a DeviceStream (device_stream.h). Every call only enqueues GPU work and returns; completion
// is observed through the stream's events. Background thread only, on the thread that called
// DeviceStream::init (NCCL and the current device are per thread). Needs loadNccl().
//
// Note [NCCL bootstrap]: (a) set rank 0 calls createUniqueId(); (b) the runtime sends those 128
// bytes to every other member over the core's authenticated control channel (never a new
// socket); (c) every member calls init(id, set_rank, set_size). ncclCommInitRank returns once
// all members joined, so (c) must run at the same point of the response list on every rank,
// like a collective. Ranks whose GPUs repeat inside the set must not get here: NCCL refuses
// duplicate GPUs, and those sets use the staged fallback (Note [Staged fallback]).
//
// Note [Scaling without kernels]: the core ships no CUDA kernels, so scale factors ride on
// NCCL: Average with no other scale is ncclAvg; any other scale on a floating-point Sum or
// Average becomes a pre-multiplied sum (ncclRedOpCreatePreMulSum, NCCL 2.11+) with the factor
// prescale * postscale (/ size for Average), which equals scaling before and after up to
// rounding. Whatever ncclCanReduce() rejects (scaled Min/Max/Product, scaled integers, integer
// Average, int16, Adasum, or no PreMulSum) goes to the staged fallback, where the CPU code
// applies it.
//
// Note [Non-blocking set-up]: a member that fails or stalls inside NCCL's set-up leaves the
// others waiting there, and a blocking ncclCommInitRank cannot be interrupted. So init() uses
// ncclCommInitRankConfig with blocking = 0 and polls ncclCommGetAsyncError, sleeping between
// polls (a back-off from 0.1 ms to 20 ms: set-up takes milliseconds to seconds, and engines
// often outnumber cores), until the state leaves ncclInProgress, the deadline passes, or
// `interrupted` (abort(), a lost peer) says stop; the last two ncclCommAbort the communicator.
// NCCL before 2.14 lacks the call: there init() blocks in ncclCommInitRank as before.
// The communicator stays non-blocking for its life: any later call (a collective, a group's
// end, which may connect peers at run time since NCCL 2.22) may answer ncclInProgress, and then
// the next call must wait until ncclCommGetAsyncError leaves it. check() does that wait, the
// same poll bounded by HVD_TIMEOUT from the call and by `interrupted`.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "transport/nccl/api.h"
#include "transport/nccl/device_stream.h"

namespace hvd::transport::nccl {

// NCCL's data type for `dtype` (bool travels as uint8), or -1 when NCCL has none (int16).
int ncclDataTypeOf(common::DataType dtype);

// True when NCCL can run this reduction with `scale` = prescale * postscale; otherwise stage.
bool ncclCanReduce(const NcclApi& api, common::DataType dtype, common::ReduceOp op,
                   double scale);

class NcclCommunicator {
 public:
  explicit NcclCommunicator(DeviceStream& stream) : stream_(stream) {}
  ~NcclCommunicator();  // ncclCommDestroy, or ncclCommAbort after abort() or an NCCL error
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  // How long init() waits, and what ends the wait early (Note [Non-blocking set-up]).
  struct SetupWait {
    std::chrono::steady_clock::time_point deadline;
    double timeout_seconds = 0;                  // HVD_TIMEOUT, for the message
    std::function<common::Status()> interrupted;  // non-OK: stop with that status
  };

  static common::Status createUniqueId(NcclUniqueId* id);
  // kTimeout past the deadline, the interruption's status when interrupted, kInternal for an
  // NCCL error; the communicator is aborted in all three cases.
  common::Status init(const NcclUniqueId& id, int rank, int size, const SetupWait& wait);
  // The same set-up for a caller that must not wait in it (point-to-point's lazy pairs, Note
  // [NCCL point-to-point] in runtime/device_nccl_peers.cc): start() issues it and returns;
  // pollSetup() looks once, never sleeping: *done once set up, non-OK as init() would end
  // (the communicator aborted). NCCL before 2.14 has no non-blocking set-up: start() refuses.
  common::Status start(const NcclUniqueId& id, int rank, int size, const SetupWait& wait);
  common::Status pollSetup(bool* done);
  bool ready() const { return comm_ != nullptr; }
  int rank() const { return rank_; }
  int size() const { return size_; }

  // Device buffers on stream().device(); in == out is allowed. `count` is in elements.
  common::Status allreduce(const void* in, void* out, size_t count, common::DataType dtype,
                           common::ReduceOp op, double scale);
  // Rank r receives the reduction of `in`'s block r (counts[r] elements, blocks back to
  // back). Equal blocks use ncclReduceScatter; Horovod's uneven split (the first dim0 % n
  // ranks get a row more) a group of ncclReduce calls, one rooted at each rank.
  common::Status reducescatter(const void* in, void* out, const std::vector<size_t>& counts,
                               common::DataType dtype, common::ReduceOp op, double scale);
  common::Status broadcast(void* buffer, size_t bytes, int root);
  // Rank r's block is bytes[r] long; out holds them back to back. Equal blocks use
  // ncclAllGather, unequal ones a group of broadcasts (first dimensions may differ per rank).
  common::Status allgather(const void* in, void* out, const std::vector<size_t>& bytes);
  // send_bytes[p] go to p from `in` (blocks back to back), recv_bytes[p] arrive from p into
  // `out` (back to back): one ncclGroup of send/recv pairs.
  common::Status alltoall(const void* in, const std::vector<size_t>& send_bytes, void* out,
                          const std::vector<size_t>& recv_bytes);
  // `bytes` to or from member `peer` (ncclSend / ncclRecv as uint8); 0 bytes queue nothing.
  common::Status send(const void* data, size_t bytes, int peer);
  common::Status recv(void* data, size_t bytes, int peer);

  // Never blocks: an error NCCL detected asynchronously (a peer died, a network failure) while
  // a collective is in flight. The background thread checks it while it polls the events and
  // calls abort() once HVD_TIMEOUT passes without the event firing.
  common::Status asyncError();
  // Unblocks a hung collective; the communicator is unusable afterwards (a new epoch makes a
  // new one).
  void abort();

 private:
  common::Status check(int result, const char* call);
  using Clock = std::chrono::steady_clock;
  common::Status awaitSetup(const SetupWait& wait);
  common::Status awaitCall(const char* call);
  // Polls ncclCommGetAsyncError (sleeping between polls) until the state leaves
  // ncclInProgress, `deadline` passes (kTimeout: "<what> did not finish ...") or
  // wait_.interrupted says stop.
  common::Status pollUntilDone(const char* call, const char* what, Clock::time_point deadline);
  // One look of pollUntilDone: *done when the state left ncclInProgress successfully.
  common::Status pollOnce(const char* call, const char* what, Clock::time_point deadline,
                          bool* done);
  common::Status reduceOp(common::DataType dtype, common::ReduceOp op, double scale, int* nccl_op,
                          bool* created);
  void destroyOp(int nccl_op, bool created);

  DeviceStream& stream_;
  const NcclApi* nccl_ = nullptr;
  NcclComm comm_ = nullptr;
  int rank_ = -1;
  int size_ = 0;
  bool broken_ = false;  // after abort() or an NCCL error: destroy by ncclCommAbort
  bool nonblocking_ = false;  // made with blocking = 0: any call may answer ncclInProgress
  SetupWait wait_;            // HVD_TIMEOUT and the interruption, for every such wait
};

}  // namespace hvd::transport::nccl
