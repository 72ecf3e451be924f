// One rank's post on the one-round board (Note [One round] in runtime/one_round.cc): the ops
// of the global set it took since its last post: ops whose data rides along (kData), then the
// names of ops that went to rank 0's negotiation whatever the others posted (kNegotiate). The
// bytes are written by the owner into its own slot and read by every rank of the host, so the
// decoder treats them as hostile: every length, count, code and size is checked against the
// slot. Any thread (no shared state).
//
// Layout: u64 round, u32 count, then per op: u8 kind, u16 name length, the name; kData then:
// the params block (u8 type, u8 dtype, u8 reduce op, u8 dims, i32 root, f64 prescale, f64
// postscale, i64 dims...), u16 splits, i64 splits... (alltoall only), u32 data bytes, zero
// padding to 16 bytes, data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "coord/message.h"

namespace hvd::runtime::one_round {

enum class PostKind : uint8_t { kData = 0, kNegotiate = 1 };
constexpr size_t kMaxPostedName = 1024;  // longer: the op closes the board
constexpr uint32_t kMaxPostedDims = 16;
constexpr uint32_t kMaxPostedSplits = 1024;  // a host's ranks (CollectiveSegment's bound)

struct PostedOp {
  PostKind kind = PostKind::kNegotiate;
  std::string_view name;
  // kData only. `params` holds the encoded params block: two ops agree iff these bytes do
  // (sameParams: dim 0 aside where it may differ, allgather and alltoall).
  std::string_view params;
  coord::OpType type = coord::OpType::kAllreduce;
  common::DataType dtype = common::DataType::kFloat32;
  common::ReduceOp reduce_op = common::ReduceOp::kSum;
  int32_t root_rank = 0;
  double prescale = 1.0;
  double postscale = 1.0;
  int64_t count = 0;                 // elements
  const uint8_t* data = nullptr;     // count x dtype bytes, or none (a broadcast's non-root)
  size_t bytes = 0;
  uint32_t dims = 0;                 // the shape and an alltoall's splits, as i64s in the post
  const uint8_t* shape = nullptr;
  uint32_t splits = 0;
  const uint8_t* split_values = nullptr;

  int64_t dim(uint32_t i) const { return readI64(shape, i); }
  int64_t split(uint32_t i) const { return readI64(split_values, i); }
  static int64_t readI64(const uint8_t* at, uint32_t i);
};

// The shape a kData op was posted with.
coord::Shape postedShape(const PostedOp& op);

// The request a kData op spells (name, type, dtype, reduce op, scales, root, shape, splits).
coord::Request postedRequest(const PostedOp& op);

// Whether two kData ops were posted with the same parameters (dim 0 aside for allgather and
// alltoall, whose first dims may differ).
bool sameParams(const PostedOp& a, const PostedOp& b);

// Builds a post in memory (storage reused from post to post), then copies it into a slot.
class PostWriter {
 public:
  void begin(uint64_t round);
  // false (nothing added) when the post would pass `capacity` bytes.
  bool addData(std::string_view name, const coord::Request& request, const void* data,
               size_t bytes, size_t capacity);  // request.splits: an alltoall's
  bool addNegotiate(std::string_view name, size_t capacity);
  uint32_t count() const { return count_; }
  // Data bytes of the last addData, in the post (the owner prescales them there).
  uint8_t* lastData() { return reinterpret_cast<uint8_t*>(&out_[last_data_]); }
  // The finished post; valid until the next begin().
  const std::string& finish();

 private:
  bool fits(size_t more, size_t capacity) const { return out_.size() + more <= capacity; }
  std::string out_;
  uint32_t count_ = 0;
  size_t last_data_ = 0;
};

// Decodes the post of `round` in `slot` (`capacity` bytes), appending its ops to *out (views
// into the slot). kInternal naming the first bad field when the bytes are malformed.
common::Status decodePost(const uint8_t* slot, size_t capacity, uint64_t round,
                          std::vector<PostedOp>* out);

}  // namespace hvd::runtime::one_round
