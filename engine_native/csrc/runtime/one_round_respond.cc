// The response of an agreed board op (runtime/one_round_respond.h).
#include "runtime/one_round_respond.h"

#include "coord/validation.h"

namespace hvd::runtime::one_round {

using coord::OpType;

namespace {

// The fields coord::buildResponse copies from the first request, from an agreed op's post.
void agreedResponse(const PostedOp& mine, coord::Key key, coord::Response* out) {
  out->type = mine.type;
  out->keys.push_back(key);
  out->dtype = mine.dtype;
  out->reduce_op = mine.reduce_op;
  out->prescale = mine.prescale;
  out->postscale = mine.postscale;
  out->root_rank = mine.root_rank;
}

// B: an allgather whose posts agree (equal params: one dtype, the same dims after the first,
// at least one dim) passes rank 0's validation; its response is what coord::buildResponse's
// fillFields makes, read from the posts without rebuilding every rank's request (~1,700
// instructions at np=2, growing with the ranks: most of what allgather paid over allreduce).
bool respondAllgather(const PostedOp& mine, const std::vector<const PostedOp*>& ops,
                      coord::Key key, coord::Response* out) {
  agreedResponse(mine, key, out);
  out->counts.push_back(static_cast<int64_t>(mine.dims) - 1);  // row dims
  coord::Shape shape = postedShape(mine);
  out->row_shape.assign(shape.begin() + 1, shape.end());
  const size_t elem = common::dataTypeSize(mine.dtype);
  for (size_t r = 0; r < ops.size(); ++r) {
    const PostedOp& theirs = *ops[r];
    shape[0] = theirs.dim(0);
    // Each rank's rows must still fit the data decoded with them (as respondByValidation checks).
    if (static_cast<size_t>(coord::elementCount(shape)) * elem != theirs.bytes) return false;
    out->first_dims.push_back(shape[0]);
  }
  return true;
}

// B: a reducescatter whose posts agree (one shape, at least one dim) passes rank 0's validation
// when its reduction is a sum or an average; its response is fillFields', read from the post.
bool respondReducescatter(const PostedOp& mine, const std::vector<const PostedOp*>& ops,
                          coord::Key key, coord::Response* out) {
  if (mine.reduce_op != common::ReduceOp::kSum && mine.reduce_op != common::ReduceOp::kAverage) {
    return false;  // rank 0 reports it
  }
  agreedResponse(mine, key, out);
  const coord::Shape shape = postedShape(mine);
  out->first_dims.assign(shape.begin(), shape.end());
  out->row_shape.assign(shape.begin() + 1, shape.end());
  const size_t bytes =
      static_cast<size_t>(coord::elementCount(shape)) * common::dataTypeSize(mine.dtype);
  for (size_t r = 0; r < ops.size(); ++r) {  // each rank's data must still fit the shape
    if (ops[r]->bytes != bytes) return false;
  }
  return true;
}

// B: an alltoall whose posts agree (one dtype, the same dims after the first) passes rank 0's
// validation when each rank's splits (its own: they are not params) fit its first dim, or, with
// none, its first dim divides among the ranks; the response is fillFields', from the posts.
bool respondAlltoall(const PostedOp& mine, const std::vector<const PostedOp*>& ops,
                     coord::Key key, coord::Response* out) {
  agreedResponse(mine, key, out);
  coord::Shape shape = postedShape(mine);
  out->row_shape.assign(shape.begin() + 1, shape.end());
  const size_t elem = common::dataTypeSize(mine.dtype);
  const int64_t n = static_cast<int64_t>(ops.size());
  for (size_t r = 0; r < ops.size(); ++r) {
    const PostedOp& theirs = *ops[r];
    shape[0] = theirs.dim(0);
    if (static_cast<size_t>(coord::elementCount(shape)) * elem != theirs.bytes) return false;
    if (theirs.splits == 0) {
      if (shape[0] % n != 0) return false;  // rank 0 explains it, as for any refusal here
      out->splits_matrix.insert(out->splits_matrix.end(), static_cast<size_t>(n), shape[0] / n);
      continue;
    }
    if (theirs.splits != static_cast<uint32_t>(n)) return false;
    int64_t left = shape[0];
    for (uint32_t i = 0; i < theirs.splits; ++i) {
      const int64_t split = theirs.split(i);
      if (split < 0 || split > left) return false;
      left -= split;
      out->splits_matrix.push_back(split);
    }
  }
  return true;
}

}  // namespace

// B: the response rank 0 would build from every rank's post; false when validation refuses it
// (the op goes to rank 0, which reports the same error on every rank).
bool respond(const PostedOp& mine, const std::vector<const PostedOp*>& ops, coord::Key key,
             const std::vector<int>& members, std::vector<coord::Request>* scratch,
             coord::Response* out) {
  if (mine.prescale != mine.prescale || mine.postscale != mine.postscale) return false;  // NaN
  if (mine.type == OpType::kAllreduce || mine.type == OpType::kBroadcast) {
    agreedResponse(mine, key, out);  // equal params: validation would pass it (the cheap path)
    out->counts.push_back(mine.count);
    return true;
  }
  if (mine.dims > 0 && mine.type == OpType::kAllgather) {
    return respondAllgather(mine, ops, key, out);
  }
  if (mine.dims > 0 && mine.type == OpType::kReducescatter) {
    return respondReducescatter(mine, ops, key, out);
  }
  if (mine.dims > 0 && mine.type == OpType::kAlltoall) return respondAlltoall(mine, ops, key, out);
  return respondByValidation(mine, ops, key, members, scratch, out);
}

bool respondByValidation(const PostedOp& mine, const std::vector<const PostedOp*>& ops,
                         coord::Key key, const std::vector<int>& members,
                         std::vector<coord::Request>* scratch, coord::Response* out) {
  scratch->clear();
  for (size_t r = 0; r < ops.size(); ++r) {
    scratch->push_back(postedRequest(*ops[r]));
    scratch->back().request_rank = static_cast<int>(r);
    scratch->back().key = key;  // named by this rank's key, as rank 0 names responses
  }
  *out = coord::buildResponse(members, *scratch, {});
  // The shapes were read from the posts again: each must still fit the data decoded with it
  // (a broadcast's non-root posts none).
  const size_t elem = common::dataTypeSize(mine.dtype);
  for (size_t r = 0; r < ops.size(); ++r) {
    if (mine.type == OpType::kBroadcast && ops[r]->data == nullptr) continue;
    const int64_t count = coord::elementCount((*scratch)[r].shape);
    if (static_cast<size_t>(count) * elem != ops[r]->bytes) return false;
  }
  return out->status == coord::ResponseType::kOk;
}

}  // namespace hvd::runtime::one_round
