// NcclCommunicator (communicator.h): collectives queued on NCCL through the loaded table.
// Bytes-only collectives (broadcast, allgather, alltoall) travel as uint8, so every dtype —
// int16 included — can use them; reductions need an NCCL type (ncclDataTypeOf).
#include "transport/nccl/communicator.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "common/text.h"
#include "transport/nccl/loader.h"

namespace hvd::transport::nccl {

using common::DataType;
using common::ReduceOp;
using common::Status;

int ncclDataTypeOf(DataType dtype) {
  switch (dtype) {
    case DataType::kUint8: return kNcclUint8;
    case DataType::kInt8: return kNcclInt8;
    case DataType::kInt16: return -1;  // NCCL has no 16-bit integer type
    case DataType::kInt32: return kNcclInt32;
    case DataType::kInt64: return kNcclInt64;
    case DataType::kFloat16: return kNcclFloat16;
    case DataType::kBfloat16: return kNcclBfloat16;
    case DataType::kFloat32: return kNcclFloat32;
    case DataType::kFloat64: return kNcclFloat64;
    case DataType::kBool: return kNcclUint8;  // 0/1 bytes; reduced with Max (or) / Min (and)
  }
  return -1;
}

bool ncclCanReduce(const NcclApi& api, DataType dtype, ReduceOp op, double scale) {
  if (ncclDataTypeOf(dtype) < 0 || op == ReduceOp::kAdasum) return false;
  // ncclAvg divides integers exactly; Horovod (and the CPU and staged paths) multiply the sum
  // by 1/size in double and truncate. Staging keeps one answer on every path.
  if (op == ReduceOp::kAverage && !common::isFloatingPoint(dtype)) return false;
  if (scale == 1.0) return true;
  const bool sum_like = op == ReduceOp::kSum || op == ReduceOp::kAverage;
  return sum_like && common::isFloatingPoint(dtype) && api.redOpCreatePreMulSum != nullptr &&
         api.redOpDestroy != nullptr;
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ == nullptr) return;
  // Queued collectives finish first; ones that do not (a peer gone) are aborted, never waited
  // for without bound.
  if (broken_ || !stream_.drain(std::chrono::steady_clock::now() + std::chrono::seconds(2))) {
    nccl_->commAbort(comm_);
    return;
  }
  nccl_->commDestroy(comm_);
}

Status NcclCommunicator::check(int result, const char* call) {
  if (result == kNcclSuccess) return Status::ok();
  // Note [Non-blocking set-up]: any call on the communicator may answer "in progress".
  if (result == kNcclInProgress && comm_ != nullptr && nonblocking_) return awaitCall(call);
  broken_ = true;  // a failed collective leaves the members out of step: never reuse it
  const char* text = nccl_ != nullptr ? nccl_->getErrorString(result) : nullptr;
  return common::internalError(std::string("NCCL error in ") + call + " (rank " +
                               std::to_string(rank_) + " of " + std::to_string(size_) + "): " +
                               (text != nullptr ? text : "unknown error") + " (code " +
                               std::to_string(result) + ")");
}

Status NcclCommunicator::createUniqueId(NcclUniqueId* id) {
  const NcclApi* nccl = ncclApi();
  if (nccl == nullptr) return common::internalError("NCCL is not loaded");
  const int result = nccl->getUniqueId(id);
  if (result == kNcclSuccess) return Status::ok();
  return common::internalError(std::string("NCCL error in ncclGetUniqueId: ") +
                               nccl->getErrorString(result));
}

Status NcclCommunicator::init(const NcclUniqueId& id, int rank, int size,
                              const SetupWait& wait) {
  nccl_ = ncclApi();
  if (nccl_ != nullptr && nccl_->commInitRankConfig == nullptr && comm_ == nullptr &&
      stream_.ready()) {  // NCCL < 2.14: blocks until all members joined
    rank_ = rank;
    size_ = size;
    return check(nccl_->commInitRank(&comm_, size, id, rank), "ncclCommInitRank");
  }
  HVD_RETURN_IF_ERROR(start(id, rank, size, wait));
  return awaitSetup(wait);
}

Status NcclCommunicator::start(const NcclUniqueId& id, int rank, int size,
                               const SetupWait& wait) {
  nccl_ = ncclApi();
  if (nccl_ == nullptr) return common::internalError("NCCL is not loaded");
  if (!stream_.ready()) return common::internalError("NcclCommunicator::init before the stream");
  if (comm_ != nullptr) return common::internalError("NcclCommunicator::init called twice");
  if (nccl_->commInitRankConfig == nullptr) {
    return common::internalError("this NCCL (before 2.14) has no non-blocking communicator "
                                 "set-up; use NCCL 2.14 or later");
  }
  rank_ = rank;
  size_ = size;
  NcclConfig config;
  config.blocking = 0;
  nonblocking_ = true;
  wait_ = wait;
  const int result = nccl_->commInitRankConfig(&comm_, size, id, rank, &config);
  if (result != kNcclSuccess && result != kNcclInProgress) {
    Status failed = check(result, "ncclCommInitRankConfig");
    abort();  // NCCL may have handed out a communicator before failing
    return failed;
  }
  return Status::ok();
}

Status NcclCommunicator::pollSetup(bool* done) {
  *done = false;
  if (comm_ == nullptr) return common::internalError("NCCL communicator set-up was not started");
  Status status = pollOnce("ncclCommInitRankConfig", "NCCL communicator set-up", wait_.deadline,
                           done);
  if (!status.isOk()) abort();
  return status;
}

// Note [Non-blocking set-up] in communicator.h.
Status NcclCommunicator::awaitSetup(const SetupWait& wait) {
  Status status = pollUntilDone("ncclCommInitRankConfig", "NCCL communicator set-up",
                                wait.deadline);
  if (!status.isOk()) abort();
  return status;
}

// A call that answered ncclInProgress: done when the communicator's state leaves it, within
// HVD_TIMEOUT of now (the communicator is broken past that).
Status NcclCommunicator::awaitCall(const char* call) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(wait_.timeout_seconds));
  common::Text what;
  what << "NCCL's " << call;
  Status status = pollUntilDone(call, what.str().c_str(), deadline);
  if (!status.isOk()) broken_ = true;
  return status;
}

Status NcclCommunicator::pollUntilDone(const char* call, const char* what,
                                       Clock::time_point deadline) {
  constexpr auto kMaxPause = std::chrono::milliseconds(20);
  Clock::duration pause = std::chrono::microseconds(100);
  for (;;) {
    bool done = false;
    HVD_RETURN_IF_ERROR(pollOnce(call, what, deadline, &done));
    if (done) return Status::ok();
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - Clock::now()));
    pause = std::min<Clock::duration>(pause * 2, kMaxPause);
  }
}

Status NcclCommunicator::pollOnce(const char* call, const char* what, Clock::time_point deadline,
                                  bool* done) {
  *done = false;
  int state = kNcclInProgress;
  const int result = nccl_->commGetAsyncError(comm_, &state);
  if (result != kNcclSuccess && result != kNcclInProgress) {
    return check(result, "ncclCommGetAsyncError");
  }
  if (result == kNcclSuccess && state == kNcclSuccess) {
    *done = true;
    return Status::ok();
  }
  if (result == kNcclSuccess && state != kNcclInProgress) {
    common::Text text;
    text << call << " (failed asynchronously)";
    return check(state, text.str().c_str());
  }
  Status status = wait_.interrupted ? wait_.interrupted() : Status::ok();
  if (!status.isOk()) return status;
  if (Clock::now() >= deadline) {
    common::Text text;
    text << what << " did not finish within HVD_TIMEOUT (" << wait_.timeout_seconds
         << " s) on set rank " << rank_ << " of " << size_;
    return common::timedOut(text.str());
  }
  return Status::ok();
}

// Note [Scaling without kernels] in communicator.h.
Status NcclCommunicator::reduceOp(DataType dtype, ReduceOp op, double scale, int* nccl_op,
                                  bool* created) {
  *created = false;
  if (!ncclCanReduce(*nccl_, dtype, op, scale)) {
    return common::internalError(std::string("NCCL cannot reduce ") +
                                 common::dataTypeName(dtype) + " with " +
                                 common::reduceOpName(op) + " and scale " +
                                 std::to_string(scale) + ": the caller must stage it");
  }
  if (dtype == DataType::kBool) {
    *nccl_op = (op == ReduceOp::kSum || op == ReduceOp::kMax) ? kNcclMax : kNcclMin;
    return Status::ok();
  }
  if (scale == 1.0) {
    switch (op) {
      case ReduceOp::kSum: *nccl_op = kNcclSum; break;
      case ReduceOp::kAverage: *nccl_op = kNcclAvg; break;
      case ReduceOp::kMin: *nccl_op = kNcclMin; break;
      case ReduceOp::kMax: *nccl_op = kNcclMax; break;
      case ReduceOp::kProduct: *nccl_op = kNcclProd; break;
      case ReduceOp::kAdasum: return common::internalError("Adasum is not an NCCL reduction");
    }
    return Status::ok();
  }
  const double factor = op == ReduceOp::kAverage ? scale / size_ : scale;
  union {
    double f64;
    float f32;
    uint16_t f16;
  } scalar;  // read by NCCL during the create call (ncclScalarHostImmediate)
  if (dtype == DataType::kFloat64) scalar.f64 = factor;
  if (dtype == DataType::kFloat32) scalar.f32 = static_cast<float>(factor);
  if (dtype == DataType::kFloat16) scalar.f16 = common::floatToHalf(static_cast<float>(factor));
  if (dtype == DataType::kBfloat16) {
    scalar.f16 = common::floatToBfloat16(static_cast<float>(factor));
  }
  HVD_RETURN_IF_ERROR(check(nccl_->redOpCreatePreMulSum(nccl_op, &scalar, ncclDataTypeOf(dtype),
                                                         kNcclScalarHostImmediate, comm_),
                            "ncclRedOpCreatePreMulSum"));
  *created = true;
  return Status::ok();
}

// NCCL allows destroying an operator as soon as the last call using it has returned.
void NcclCommunicator::destroyOp(int nccl_op, bool created) {
  if (created) nccl_->redOpDestroy(nccl_op, comm_);
}

Status NcclCommunicator::allreduce(const void* in, void* out, size_t count, DataType dtype,
                                   ReduceOp op, double scale) {
  if (count == 0) return Status::ok();  // every member has the same count
  int nccl_op = 0;
  bool created = false;
  HVD_RETURN_IF_ERROR(reduceOp(dtype, op, scale, &nccl_op, &created));
  const int result = nccl_->allReduce(in, out, count, ncclDataTypeOf(dtype), nccl_op, comm_,
                                      stream_.stream());
  destroyOp(nccl_op, created);
  return check(result, "ncclAllReduce");
}

Status NcclCommunicator::reducescatter(const void* in, void* out,
                                       const std::vector<size_t>& counts, DataType dtype,
                                       ReduceOp op, double scale) {
  if (static_cast<int>(counts.size()) != size_) {
    return common::internalError("reducescatter: one block size per member expected");
  }
  bool equal = true;
  size_t total = 0;
  for (size_t c : counts) {
    equal = equal && c == counts[0];
    total += c;
  }
  if (total == 0) return Status::ok();
  int nccl_op = 0;
  bool created = false;
  HVD_RETURN_IF_ERROR(reduceOp(dtype, op, scale, &nccl_op, &created));
  const int type = ncclDataTypeOf(dtype);
  Status status;
  if (equal) {
    status = check(nccl_->reduceScatter(in, out, counts[0], type, nccl_op, comm_,
                                        stream_.stream()),
                   "ncclReduceScatter");
  } else {
    const size_t element = common::dataTypeSize(dtype);
    const auto* base = static_cast<const uint8_t*>(in);
    status = check(nccl_->groupStart(), "ncclGroupStart");
    size_t offset = 0;
    for (int r = 0; r < size_ && status.isOk(); ++r) {
      if (counts[r] > 0) {  // recvbuff is read only on the root
        status = check(nccl_->reduce(base + offset * element, out, counts[r], type, nccl_op, r,
                                     comm_, stream_.stream()),
                       "ncclReduce");
      }
      offset += counts[r];
    }
    const Status end = check(nccl_->groupEnd(), "ncclGroupEnd");
    if (status.isOk()) status = end;
  }
  destroyOp(nccl_op, created);
  return status;
}

Status NcclCommunicator::broadcast(void* buffer, size_t bytes, int root) {
  if (bytes == 0) return Status::ok();
  return check(nccl_->broadcast(buffer, buffer, bytes, kNcclUint8, root, comm_,
                                stream_.stream()),
               "ncclBroadcast");
}

Status NcclCommunicator::allgather(const void* in, void* out, const std::vector<size_t>& bytes) {
  if (static_cast<int>(bytes.size()) != size_) {
    return common::internalError("allgather: one block size per member expected");
  }
  bool equal = true;
  for (size_t b : bytes) equal = equal && b == bytes[0];
  auto* base = static_cast<uint8_t*>(out);
  if (equal) {
    if (bytes[0] == 0) return Status::ok();
    return check(nccl_->allGather(in, out, bytes[0], kNcclUint8, comm_, stream_.stream()),
                 "ncclAllGather");
  }
  Status status = check(nccl_->groupStart(), "ncclGroupStart");
  size_t offset = 0;
  for (int r = 0; r < size_ && status.isOk(); ++r) {
    if (bytes[r] > 0) {
      const void* send = r == rank_ ? in : base + offset;
      status = check(nccl_->broadcast(send, base + offset, bytes[r], kNcclUint8, r, comm_,
                                      stream_.stream()),
                     "ncclBroadcast");
    }
    offset += bytes[r];
  }
  const Status end = check(nccl_->groupEnd(), "ncclGroupEnd");  // always close the group
  return status.isOk() ? end : status;
}

Status NcclCommunicator::alltoall(const void* in, const std::vector<size_t>& send_bytes,
                                  void* out, const std::vector<size_t>& recv_bytes) {
  if (static_cast<int>(send_bytes.size()) != size_ ||
      static_cast<int>(recv_bytes.size()) != size_) {
    return common::internalError("alltoall: one send and one receive size per member expected");
  }
  const auto* send_base = static_cast<const uint8_t*>(in);
  auto* recv_base = static_cast<uint8_t*>(out);
  Status status = check(nccl_->groupStart(), "ncclGroupStart");
  size_t send_offset = 0, recv_offset = 0;
  for (int p = 0; p < size_ && status.isOk(); ++p) {
    if (send_bytes[p] > 0) {  // p's recv_bytes[rank] equals it, so both sides skip alike
      status = check(nccl_->send(send_base + send_offset, send_bytes[p], kNcclUint8, p, comm_,
                                 stream_.stream()),
                     "ncclSend");
    }
    if (status.isOk() && recv_bytes[p] > 0) {
      status = check(nccl_->recv(recv_base + recv_offset, recv_bytes[p], kNcclUint8, p, comm_,
                                 stream_.stream()),
                     "ncclRecv");
    }
    send_offset += send_bytes[p];
    recv_offset += recv_bytes[p];
  }
  const Status end = check(nccl_->groupEnd(), "ncclGroupEnd");
  return status.isOk() ? end : status;
}

Status NcclCommunicator::send(const void* data, size_t bytes, int peer) {
  if (bytes == 0) return Status::ok();
  return check(nccl_->send(data, bytes, kNcclUint8, peer, comm_, stream_.stream()), "ncclSend");
}

Status NcclCommunicator::recv(void* data, size_t bytes, int peer) {
  if (bytes == 0) return Status::ok();
  return check(nccl_->recv(data, bytes, kNcclUint8, peer, comm_, stream_.stream()), "ncclRecv");
}

Status NcclCommunicator::asyncError() {
  if (comm_ == nullptr) return Status::ok();
  int result = kNcclSuccess;
  HVD_RETURN_IF_ERROR(check(nccl_->commGetAsyncError(comm_, &result), "ncclCommGetAsyncError"));
  if (result == kNcclSuccess || result == kNcclInProgress) return Status::ok();
  return check(result, "a collective in flight (ncclCommGetAsyncError)");
}

void NcclCommunicator::abort() {
  if (comm_ == nullptr) return;
  nccl_->commAbort(comm_);
  comm_ = nullptr;
  broken_ = true;
}

}  // namespace hvd::transport::nccl
