#include "runtime/op_layout.h"

#include <algorithm>
#include <functional>
#include <numeric>

namespace hvd::runtime {

namespace {

int64_t product(const std::vector<int64_t>& dims) {
  return std::accumulate(dims.begin(), dims.end(), int64_t{1}, std::multiplies<int64_t>());
}

size_t rowBytes(const coord::Response& r) {
  return static_cast<size_t>(product(r.row_shape)) * common::dataTypeSize(r.dtype);
}

}  // namespace

GatherLayout allgatherLayout(const coord::Response& r) {
  GatherLayout out;
  const size_t row = rowBytes(r);
  out.bytes.resize(r.first_dims.size());
  int64_t rows = 0;
  for (size_t i = 0; i < r.first_dims.size(); ++i) {
    out.bytes[i] = static_cast<size_t>(r.first_dims[i]) * row;
    out.total += out.bytes[i];
    rows += r.first_dims[i];
  }
  out.shape = {rows};
  out.shape.insert(out.shape.end(), r.row_shape.begin(), r.row_shape.end());
  return out;
}

common::Status fusedAllgatherLayout(const coord::Response& r, int set_size,
                                    FusedGatherLayout* out) {
  const size_t n = static_cast<size_t>(set_size);
  const size_t tensors = r.keys.size();
  if (set_size <= 0 || r.counts.size() != tensors || r.first_dims.size() != tensors * n) {
    return common::internalError("fused allgather: " + std::to_string(r.first_dims.size()) +
                                 " first dims for " + std::to_string(tensors) + " tensors of " +
                                 std::to_string(set_size) + " ranks");
  }
  const size_t element = common::dataTypeSize(r.dtype);
  out->block.assign(n, 0);
  out->block_offset.assign(n, 0);
  out->part_offset.assign(tensors * n, 0);
  out->part_bytes.assign(tensors * n, 0);
  out->output_bytes.assign(tensors, 0);
  out->shapes.assign(tensors, {});
  size_t dim = 0;
  for (size_t i = 0; i < tensors; ++i) {
    const size_t dims = static_cast<size_t>(r.counts[i]);
    if (dim + dims > r.row_shape.size()) {
      return common::internalError("fused allgather: row shapes shorter than their dims");
    }
    const auto first = r.row_shape.begin() + static_cast<std::ptrdiff_t>(dim);
    const auto last = first + static_cast<std::ptrdiff_t>(dims);
    const size_t row = static_cast<size_t>(std::accumulate(first, last, int64_t{1},
                                                           std::multiplies<int64_t>())) *
                       element;
    dim += dims;
    int64_t rows = 0;
    for (size_t k = 0; k < n; ++k) {
      const size_t part = static_cast<size_t>(r.first_dims[i * n + k]) * row;
      out->part_offset[i * n + k] = out->block[k];
      out->part_bytes[i * n + k] = part;
      out->block[k] += part;
      out->output_bytes[i] += part;
      rows += r.first_dims[i * n + k];
    }
    out->shapes[i] = {rows};
    out->shapes[i].insert(out->shapes[i].end(), first, last);
  }
  for (size_t k = 0; k < n; ++k) {
    out->block_offset[k] = out->total;
    out->total += out->block[k];
  }
  return common::Status::ok();
}

AlltoallLayout alltoallLayout(const coord::Response& r, int me, int n) {
  AlltoallLayout out;
  const size_t row = rowBytes(r);
  out.send.resize(n);
  out.recv.resize(n);
  out.received_splits.resize(n);
  int64_t rows = 0;
  for (int j = 0; j < n; ++j) {
    out.send[j] = static_cast<size_t>(r.splits_matrix[me * n + j]) * row;
    const int64_t in_rows = r.splits_matrix[j * n + me];
    out.recv[j] = static_cast<size_t>(in_rows) * row;
    out.received_splits[j] = in_rows;
    out.total += out.recv[j];
    rows += in_rows;
  }
  // The same on every rank: the shm alltoall's chunk count (algo/alltoall_shm.cc).
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      const size_t block = static_cast<size_t>(r.splits_matrix[i * n + j]) * row;
      if (i != j) out.largest = std::max(out.largest, block);
    }
  }
  out.shape = {rows};
  out.shape.insert(out.shape.end(), r.row_shape.begin(), r.row_shape.end());
  return out;
}

// Horovod's split: the first dim0 % n ranks get one more row.
ReducescatterLayout reducescatterLayout(const coord::Response& r, int me, int n) {
  ReducescatterLayout out;
  const int64_t dim0 = r.first_dims.empty() ? 0 : r.first_dims[0];
  const int64_t row_elems = product(r.row_shape);
  out.counts.resize(n);
  for (int i = 0; i < n; ++i) {
    const int64_t rows = dim0 / n + (i < dim0 % n ? 1 : 0);
    out.counts[i] = static_cast<size_t>(rows * row_elems);
  }
  const int64_t my_rows = dim0 / n + (me < dim0 % n ? 1 : 0);
  out.shape = {my_rows};
  out.shape.insert(out.shape.end(), r.row_shape.begin(), r.row_shape.end());
  out.input_bytes = static_cast<size_t>(dim0 * row_elems) * common::dataTypeSize(r.dtype);
  return out;
}

int64_t totalCount(const coord::Response& r) {
  return std::accumulate(r.counts.begin(), r.counts.end(), int64_t{0});
}

size_t broadcastBytes(const coord::Response& r) {
  return static_cast<size_t>(r.counts.empty() ? 0 : r.counts[0]) * common::dataTypeSize(r.dtype);
}

double postFactor(const coord::Response& r, int set_size) {
  double post = r.postscale;
  if (r.reduce_op == common::ReduceOp::kAverage) post /= set_size;
  return post;
}

}  // namespace hvd::runtime
