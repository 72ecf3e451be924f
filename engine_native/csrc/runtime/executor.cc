#include "runtime/executor.h"

#include <chrono>
#include <cstring>
#include <numeric>

#include "algo/algorithms.h"
#include "common/logging.h"

namespace hvd::runtime {

using common::DataType;
using common::Status;
using coord::OpType;

namespace {

int64_t product(const std::vector<int64_t>& dims) {
  return std::accumulate(dims.begin(), dims.end(), int64_t{1}, std::multiplies<int64_t>());
}

double elapsedSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Executor::Executor(HandleTable& handles, Metrics& metrics, const common::Config& config,
                   timeline::Timeline* timeline, const coord::KeyTable& keys)
    : handles_(handles), metrics_(metrics), config_(config), timeline_(timeline), keys_(keys),
      hierarchical_(config.hierarchical_allreduce) {}

uint8_t* Executor::fusionBuffer(size_t bytes) {
  if (fusion_buffer_.size() < bytes) fusion_buffer_.resize(bytes);
  return fusion_buffer_.data();
}

// ---- timeline ----------------------------------------------------------------------------
// Note [Timeline detail]: while a timeline file is written (rank 0), every name of a response
// gets the same spans, as Horovod's *All calls do: <OP> with dtype/shape, its activities, the
// end. Otherwise only the in-memory strip listens, which draws collectives: one <OP> span per
// response, under its first name ("name (+k fused)" for a fused batch), no activities. That
// keeps an always-on strip at two records per batch instead of ~10 per tensor.

void Executor::recordStart(const coord::Response& r, const std::vector<TensorEntry*>& entries) {
  detailed_now_ = recording() && detailed_.load(std::memory_order_relaxed);
  if (!recording() || r.type == OpType::kJoin || r.keys.empty()) return;
  const char* op = coord::opTypeName(r.type);
  std::vector<int64_t> shape;
  if (!detailed_now_) {
    summary_ = keys_.name(r.keys[0]);
    if (r.keys.size() > 1) summary_ += " (+" + std::to_string(r.keys.size() - 1) + " fused)";
    if (entries[0] != nullptr) {
      shape.assign(entries[0]->request.shape.begin(), entries[0]->request.shape.end());
    }
    timeline_->start(summary_, op, r.dtype, shape);
    return;
  }
  timeline_->beginGroup(op);  // Note [Response groups] in timeline.cc
  for (size_t i = 0; i < r.keys.size(); ++i) {
    if (entries[i] != nullptr) {
      const coord::Shape& dims = entries[i]->request.shape;
      timeline_->start(keys_.name(r.keys[i]), op, r.dtype,
                       std::vector<int64_t>(dims.begin(), dims.end()));
      continue;
    }
    shape.assign(1, i < r.counts.size() ? r.counts[i] : 0);  // a joined rank's zeros
    timeline_->start(keys_.name(r.keys[i]), op, r.dtype, shape);
  }
}

void Executor::activityStartAll(const coord::Response& r, const char* activity) {
  if (!detailed_now_ || r.keys.empty()) return;
  timeline_->activityStartGroup(activity[0] == '_' ? transport_ + activity : activity);
}

void Executor::activityEndAll(const coord::Response& r) {
  if (detailed_now_ && !r.keys.empty()) timeline_->activityEndGroup();
}

void Executor::recordEnd(const coord::Response& r, const std::string& error) {
  if (!recording() || r.type == OpType::kJoin) return;
  if (r.status == coord::ResponseType::kError) {
    for (coord::Key key : r.keys) timeline_->end(keys_.name(key), error);  // errors: every name
  } else if (detailed_now_) {
    timeline_->endGroup(error);
  } else if (!r.keys.empty()) {
    timeline_->end(summary_, error);
  }
}

// Completes the handles of the response being executed, all under one lock, and removes their
// entries (after the handles: a caller may resubmit a name only once its wait returned).
void Executor::complete(const Status& status, const OpResult& result) {
  handles_.completeMany(done_handles_.data(), done_handles_.size(), status, result);
}

Status Executor::execute(const coord::Response& r, EntryTable& table, transport::Comm& comm,
                         const std::string& transport) {
  transport_ = transport;
  entries_.assign(r.keys.size(), nullptr);
  done_handles_.clear();
  for (size_t i = 0; i < r.keys.size(); ++i) {
    entries_[i] = table.find(r.keys[i]);  // nullptr: joined rank, contributes zeros
    if (entries_[i] != nullptr) done_handles_.push_back(entries_[i]->handle);
  }
  Status status;
  OpResult result;
  if (r.status == coord::ResponseType::kError) {
    metrics_.setLastError(r.error);
    recordEnd(r, r.error);  // an ERROR tick per name (the negotiation span already closed)
    status = common::mismatch(r.error);
    complete(status, result);
    for (coord::Key key : r.keys) table.erase(key);
    return Status::ok();
  }
  TensorEntry* first = entries_.empty() ? nullptr : entries_[0];
  recordStart(r, entries_);
  metrics_.beginOp(coord::opTypeName(r.type), r.keys.empty() ? "" : keys_.name(r.keys[0]));
  auto t0 = std::chrono::steady_clock::now();
  switch (r.type) {
    case OpType::kAllreduce: status = allreduce(r, entries_, comm); break;
    case OpType::kAllgather: status = allgather(r, first, comm, &result); break;
    case OpType::kBroadcast: status = broadcast(r, first, comm); break;
    case OpType::kAlltoall: status = alltoall(r, first, comm, &result); break;
    case OpType::kReducescatter: status = reducescatter(r, first, comm, &result); break;
    case OpType::kBarrier:
      activityStartAll(r, "_BARRIER");
      status = algo::barrier(comm);
      activityEndAll(r);
      break;
    case OpType::kJoin: result.last_joined_rank = r.last_joined_rank; break;
  }
  metrics_.addCommunicate(elapsedSince(t0));
  metrics_.endOp();
  if (!status.isOk() && refine_) status = refine_(status);
  if (!status.isOk()) metrics_.setLastError(status.message());
  recordEnd(r, status.isOk() ? std::string() : status.message());
  complete(status, result);
  for (coord::Key key : r.keys) table.erase(key);
  return status;
}

// Note [Fusion without a buffer]: when the host pipeline serves the set (allreduceTakesTensors)
// and nothing has to be scaled before the reduction, a fused batch (or an out-of-place single
// tensor) is handed to it as its tensors: it reads the inputs and writes the outputs directly,
// and the copies into and out of the fusion buffer (MEMCPY_*_FUSION_BUFFER) do not happen.
// Elsewhere — TCP, a joined rank's zeros, a prescale factor, small batches — the batch is
// packed into the persistent fusion buffer as before.
bool Executor::allreduceTensors(const coord::Response& r,
                                const std::vector<TensorEntry*>& entries, transport::Comm& comm,
                                const algo::AllreduceChoice& choice, size_t total,
                                Status* status) {
  if (r.prescale != 1.0 || (r.keys.size() == 1 && entries[0] != nullptr &&
                            entries[0]->input == entries[0]->output)) {
    return false;
  }
  spans_.clear();
  for (size_t i = 0; i < r.keys.size(); ++i) {
    if (entries[i] == nullptr) return false;  // a joined rank: its zeros need the buffer
    spans_.push_back({entries[i]->input, entries[i]->output, static_cast<size_t>(r.counts[i])});
  }
  algo::AllreduceOptions opts;
  opts.tensors = &spans_;
  opts.count = total;
  opts.dtype = r.dtype;
  opts.op = r.reduce_op;
  if (!algo::allreduceTakesTensors(comm, opts, choice)) return false;
  activityStartAll(r, "_ALLREDUCE");
  *status = algo::allreduce(comm, opts, choice);
  if (!status->isOk()) return true;
  activityEndAll(r);
  double post = r.postscale;
  if (r.reduce_op == common::ReduceOp::kAverage) post /= comm.size();
  if (post != 1.0) {
    for (const algo::TensorSpan& s : spans_) common::scaleInPlace(s.output, s.count, r.dtype, post);
  }
  return true;
}

Status Executor::allreduce(const coord::Response& r, const std::vector<TensorEntry*>& entries,
                           transport::Comm& comm) {
  const size_t elem = common::dataTypeSize(r.dtype);
  const int64_t total = std::accumulate(r.counts.begin(), r.counts.end(), int64_t{0});
  const size_t bytes = static_cast<size_t>(total) * elem;
  const auto choice = algo::AllreduceChoice::fromConfig(config_, hierarchicalAllreduce());
  Status direct;
  if (allreduceTensors(r, entries, comm, choice, static_cast<size_t>(total), &direct)) {
    HVD_RETURN_IF_ERROR(direct);
    metrics_.countOp(static_cast<int>(OpType::kAllreduce), bytes, r.keys.size());
    return Status::ok();
  }
  const bool fused = r.keys.size() > 1 || entries[0] == nullptr;
  uint8_t* buffer = nullptr;
  if (fused) {
    // Copy every tensor into its slot of the fusion buffer; a joined rank's slots stay zero.
    activityStartAll(r, "MEMCPY_IN_FUSION_BUFFER");
    buffer = fusionBuffer(bytes);
    size_t offset = 0;
    for (size_t i = 0; i < r.keys.size(); ++i) {
      const size_t n = static_cast<size_t>(r.counts[i]) * elem;
      if (entries[i] != nullptr && n > 0) {
        std::memcpy(buffer + offset, entries[i]->input, n);
      } else if (n > 0) {
        std::memset(buffer + offset, 0, n);
      }
      offset += n;
    }
    activityEndAll(r);
  } else {
    buffer = static_cast<uint8_t*>(entries[0]->output);
    if (entries[0]->input != entries[0]->output && bytes > 0) {
      std::memcpy(buffer, entries[0]->input, bytes);
    }
  }
  if (r.prescale != 1.0) common::scaleInPlace(buffer, total, r.dtype, r.prescale);
  algo::AllreduceOptions opts;
  opts.data = buffer;
  opts.count = static_cast<size_t>(total);
  opts.dtype = r.dtype;
  opts.op = r.reduce_op;
  opts.segment_bytes = static_cast<size_t>(config_.tcp_segment_bytes);
  activityStartAll(r, "_ALLREDUCE");
  HVD_RETURN_IF_ERROR(algo::allreduce(comm, opts, choice));
  activityEndAll(r);
  double post = r.postscale;
  if (r.reduce_op == common::ReduceOp::kAverage) post /= comm.size();
  if (post != 1.0) common::scaleInPlace(buffer, total, r.dtype, post);
  if (fused) {
    activityStartAll(r, "MEMCPY_OUT_FUSION_BUFFER");
    size_t offset = 0;
    for (size_t i = 0; i < r.keys.size(); ++i) {
      const size_t n = static_cast<size_t>(r.counts[i]) * elem;
      if (entries[i] != nullptr && n > 0) std::memcpy(entries[i]->output, buffer + offset, n);
      offset += n;
    }
    activityEndAll(r);
  }
  metrics_.countOp(static_cast<int>(OpType::kAllreduce), bytes, r.keys.size());
  return Status::ok();
}

Status Executor::allgather(const coord::Response& r, TensorEntry* entry, transport::Comm& comm,
                           OpResult* result) {
  const size_t row_bytes =
      static_cast<size_t>(product(r.row_shape)) * common::dataTypeSize(r.dtype);
  std::vector<size_t> bytes(r.first_dims.size());
  int64_t rows = 0;
  for (size_t i = 0; i < r.first_dims.size(); ++i) {
    bytes[i] = static_cast<size_t>(r.first_dims[i]) * row_bytes;
    rows += r.first_dims[i];
  }
  size_t total = std::accumulate(bytes.begin(), bytes.end(), size_t{0});
  result->buffer = std::make_shared<OutputBuffer>(total);
  result->shape = {rows};
  result->shape.insert(result->shape.end(), r.row_shape.begin(), r.row_shape.end());
  const void* in = entry != nullptr ? entry->input : nullptr;
  activityStartAll(r, "_ALLGATHER");
  HVD_RETURN_IF_ERROR(algo::allgatherRing(comm, in, result->buffer->data, bytes));
  activityEndAll(r);
  metrics_.countOp(static_cast<int>(OpType::kAllgather), total, 1);
  return Status::ok();
}

Status Executor::broadcast(const coord::Response& r, TensorEntry* entry, transport::Comm& comm) {
  const size_t bytes = static_cast<size_t>(r.counts.empty() ? 0 : r.counts[0]) *
                       common::dataTypeSize(r.dtype);
  std::vector<uint8_t> scratch;
  void* data = nullptr;
  if (entry != nullptr) {
    data = entry->output;
    if (entry->input != entry->output && bytes > 0) std::memcpy(data, entry->input, bytes);
  } else {
    scratch.resize(bytes);
    data = scratch.data();
  }
  int root = -1;  // the response carries the global root rank; algorithms use set ranks
  for (int i = 0; i < comm.size(); ++i) {
    if (comm.globalRank(i) == r.root_rank) root = i;
  }
  if (root < 0) {
    return common::internalError("broadcast root rank " + std::to_string(r.root_rank) +
                                 " is not in the process set");
  }
  activityStartAll(r, "_BCAST");
  HVD_RETURN_IF_ERROR(algo::broadcastTree(comm, data, bytes, root));
  activityEndAll(r);
  metrics_.countOp(static_cast<int>(OpType::kBroadcast), bytes, 1);
  return Status::ok();
}

Status Executor::alltoall(const coord::Response& r, TensorEntry* entry, transport::Comm& comm,
                          OpResult* result) {
  const int n = comm.size();
  const int me = comm.rank();
  const size_t row_bytes =
      static_cast<size_t>(product(r.row_shape)) * common::dataTypeSize(r.dtype);
  std::vector<size_t> send(n), recv(n);
  int64_t rows = 0;
  result->received_splits.resize(n);
  for (int j = 0; j < n; ++j) {
    send[j] = static_cast<size_t>(r.splits_matrix[me * n + j]) * row_bytes;
    int64_t in_rows = r.splits_matrix[j * n + me];
    recv[j] = static_cast<size_t>(in_rows) * row_bytes;
    result->received_splits[j] = in_rows;
    rows += in_rows;
  }
  size_t total = std::accumulate(recv.begin(), recv.end(), size_t{0});
  result->buffer = std::make_shared<OutputBuffer>(total);
  result->shape = {rows};
  result->shape.insert(result->shape.end(), r.row_shape.begin(), r.row_shape.end());
  const void* in = entry != nullptr ? entry->input : nullptr;
  activityStartAll(r, "_ALLTOALL");
  HVD_RETURN_IF_ERROR(algo::alltoallPairwise(comm, in, send, result->buffer->data, recv));
  activityEndAll(r);
  metrics_.countOp(static_cast<int>(OpType::kAlltoall), total, 1);
  return Status::ok();
}

Status Executor::reducescatter(const coord::Response& r, TensorEntry* entry,
                               transport::Comm& comm, OpResult* result) {
  // Horovod's split: the first dim0 % n ranks get one more row.
  const int n = comm.size();
  const int64_t dim0 = r.first_dims.empty() ? 0 : r.first_dims[0];
  const int64_t row_elems = product(r.row_shape);
  std::vector<size_t> counts(n);
  for (int i = 0; i < n; ++i) {
    int64_t rows = dim0 / n + (i < dim0 % n ? 1 : 0);
    counts[i] = static_cast<size_t>(rows * row_elems);
  }
  const int me = comm.rank();
  const size_t elem = common::dataTypeSize(r.dtype);
  result->buffer = std::make_shared<OutputBuffer>(counts[me] * elem);
  result->shape = {static_cast<int64_t>(row_elems == 0 ? dim0 / n + (me < dim0 % n ? 1 : 0)
                                                       : counts[me] / row_elems)};
  result->shape.insert(result->shape.end(), r.row_shape.begin(), r.row_shape.end());
  const void* in = entry != nullptr ? entry->input : nullptr;
  activityStartAll(r, "_REDUCESCATTER");
  HVD_RETURN_IF_ERROR(
      algo::reducescatterRing(comm, in, result->buffer->data, counts, r.dtype, r.reduce_op));
  activityEndAll(r);
  // Scaling commutes with the sum, so both factors are applied to this rank's block only.
  double factor = r.prescale * r.postscale;
  if (r.reduce_op == common::ReduceOp::kAverage) factor /= n;
  if (factor != 1.0) common::scaleInPlace(result->buffer->data, counts[me], r.dtype, factor);
  metrics_.countOp(static_cast<int>(OpType::kReducescatter), dim0 * row_elems * elem, 1);
  return Status::ok();
}

}  // namespace hvd::runtime
