// The one-round board's post decoder (runtime/one_round_post.h): a post comes from another
// process's slot, so every length, code and size must be checked against the slot. An accepted
// post must re-encode (PostWriter) to exactly the bytes it was read from, and every view it
// hands out must lie inside the input.
#include <cstring>

#include "common/byte_codec.h"
#include "fuzz.h"
#include "runtime/one_round_post.h"

namespace hvd::fuzz {
namespace {

using runtime::one_round::PostedOp;
using runtime::one_round::PostKind;
using runtime::one_round::PostWriter;

constexpr uint64_t kRound = 7;
constexpr size_t kCapacity = 32 << 10;

std::vector<std::string> postSeeds(Rng& rng) {
  std::vector<std::string> seeds;
  for (int s = 0; s < 8; ++s) {
    PostWriter w;
    w.begin(kRound);
    for (uint64_t n = rng.below(6); n > 0; --n) {
      const std::string name = "op." + std::to_string(rng.below(1000));
      if (rng.chance(3)) {
        w.addNegotiate(name, kCapacity);
        continue;
      }
      coord::Request r;
      r.type = static_cast<coord::OpType>(rng.below(5));  // the five collectives
      if (r.type == coord::OpType::kAlltoall) {
        for (uint64_t k = rng.below(4); k > 0; --k) r.splits.push_back(rng.below(3));
      }
      r.dtype = static_cast<common::DataType>(rng.below(common::kNumDataTypes));
      r.reduce_op = static_cast<common::ReduceOp>(rng.below(6));
      r.root_rank = static_cast<int32_t>(rng.below(4));
      r.prescale = rng.chance(2) ? 1.0 : 0.5;
      for (uint64_t d = rng.below(3); d > 0; --d) r.shape.push_back(1 + rng.below(5));
      int64_t count = 1;
      for (int64_t d : r.shape) count *= d;
      const std::string data = rng.bytes(rng.chance(3) ? 0 : count * common::dataTypeSize(r.dtype));
      w.addData(name, r, data.data(), data.size(), kCapacity);
    }
    seeds.push_back(w.finish());
  }
  return seeds;
}

bool inside(const void* p, size_t n, const std::string& in) {
  const char* c = static_cast<const char*>(p);
  return n == 0 || (c >= in.data() && c + n <= in.data() + in.size());
}

Outcome runPost(const std::string& in) {
  std::vector<PostedOp> ops;
  const auto* slot = reinterpret_cast<const uint8_t*>(in.data());
  common::Status s = runtime::one_round::decodePost(slot, in.size(), kRound, &ops);
  if (!s.isOk()) {
    return s.code() == common::Code::kInternal ? rejected() : failed("status " + s.message());
  }
  PostWriter w;
  w.begin(kRound);
  for (const PostedOp& op : ops) {
    if (!inside(op.name.data(), op.name.size(), in) || !inside(op.data, op.bytes, in) ||
        !inside(op.shape, 8 * static_cast<size_t>(op.dims), in) ||
        !inside(op.split_values, 8 * static_cast<size_t>(op.splits), in)) {
      return failed("a view outside the input");
    }
    if (op.kind == PostKind::kNegotiate) {
      w.addNegotiate(op.name, kCapacity * 4);
    } else {
      const coord::Request r = runtime::one_round::postedRequest(op);
      w.addData(op.name, r, op.data, op.bytes, kCapacity * 4);
    }
  }
  const std::string& again = w.finish();
  if (again.size() > in.size() || std::memcmp(again.data(), in.data(), again.size()) != 0) {
    return failed("an accepted post re-encodes to other bytes");
  }
  return accepted();
}

}  // namespace

void addRuntimeTargets(std::vector<Target>* out) {
  out->push_back({"one_round_post", "runtime::one_round::decodePost", postSeeds, runPost});
}

}  // namespace hvd::fuzz
