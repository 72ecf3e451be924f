// The one-round board's post decoder (runtime/one_round_post.h): a post comes from another
// process's slot, so every length, code and size must be checked against the slot. An accepted
// post must re-encode (PostWriter) to exactly the bytes it was read from, and every view it
// hands out must lie inside the input. And the response an agreed op runs with
// (runtime/one_round_respond.h), made from the posts of every rank: it must be what rank 0's
// validation makes of the same posts (respondByValidation), accepted or refused alike.
#include <cstring>

#include "common/byte_codec.h"
#include "fuzz.h"
#include "runtime/one_round_post.h"
#include "runtime/one_round_respond.h"

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
      // Mostly the ops answered directly, whose refusals (splits, reduce ops) are what to compare.
  r.type = rng.chance(2) ? (rng.chance(2) ? coord::OpType::kAlltoall
                                          : coord::OpType::kReducescatter)
                         : static_cast<coord::OpType>(rng.below(5));  // the five collectives
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

// --- one_round_respond: input = u8 ranks (2 + value % 3), then per rank a u16 length and
// that rank's post. The op decided is the first kData op of rank 0's post.

std::string agreedSeed(Rng& rng) {
  const int n = 2 + static_cast<int>(rng.below(3));
  coord::Request r;
  // Mostly the ops answered directly, whose refusals (splits, reduce ops) are what to compare.
  r.type = rng.chance(2) ? (rng.chance(2) ? coord::OpType::kAlltoall
                                          : coord::OpType::kReducescatter)
                         : static_cast<coord::OpType>(rng.below(5));
  r.dtype = static_cast<common::DataType>(rng.below(common::kNumDataTypes));
  r.reduce_op = static_cast<common::ReduceOp>(rng.below(6));
  r.root_rank = static_cast<int32_t>(rng.below(static_cast<uint64_t>(n) + 1));
  r.prescale = rng.chance(2) ? 1.0 : 0.5;
  for (uint64_t d = rng.below(4); d > 0; --d) {
    r.shape.push_back(rng.chance(8) ? 0 : 1 + static_cast<int64_t>(rng.below(3)));
  }
  const bool dim0_varies = r.type == coord::OpType::kAllgather ||
                           r.type == coord::OpType::kAlltoall;
  std::string in(1, static_cast<char>(n - 2));
  for (int rank = 0; rank < n; ++rank) {
    coord::Request mine = r;
    if (dim0_varies && !mine.shape.empty()) mine.shape[0] = 1 + static_cast<int64_t>(rng.below(6));
    if (mine.type == coord::OpType::kAlltoall && !mine.shape.empty() && rng.chance(2)) {
      const uint64_t count = rng.chance(4) ? rng.below(5) : static_cast<uint64_t>(n);
      int64_t left = mine.shape[0];
      for (uint64_t k = 0; k < count; ++k) {  // mostly fitting, sometimes not
        const int64_t split = rng.chance(5) ? -1 : static_cast<int64_t>(rng.below(3));
        mine.splits.push_back(rng.chance(3) ? std::min(split, left) : split);
        left -= mine.splits.back();
      }
    }
    int64_t count = 1;
    for (int64_t d : mine.shape) count *= d;
    const bool carries = mine.type != coord::OpType::kBroadcast || mine.root_rank == rank;
    const std::string data =
        rng.bytes(carries ? static_cast<size_t>(count) * common::dataTypeSize(mine.dtype) : 0);
    PostWriter w;
    w.begin(kRound);
    if (rng.chance(3)) w.addNegotiate("other", kCapacity);
    w.addData("agreed", mine, data.data(), data.size(), kCapacity);
    const std::string& post = w.finish();
    std::string length;
    common::ByteWriter(&length).u16(static_cast<uint16_t>(post.size()));
    in += length + post;
  }
  return in;
}

std::vector<std::string> agreedSeeds(Rng& rng) {
  std::vector<std::string> seeds;
  for (int s = 0; s < 256; ++s) seeds.push_back(agreedSeed(rng));
  return seeds;
}

// The first kData op named `name` in `ops`, or nullptr.
const PostedOp* dataOp(const std::vector<PostedOp>& ops, std::string_view name) {
  for (const PostedOp& op : ops) {
    if (op.kind == PostKind::kData && op.name == name) return &op;
  }
  return nullptr;
}

std::string differs(const coord::Response& a, const coord::Response& b) {
  if (a.type != b.type || !(a.keys == b.keys) || a.dtype != b.dtype) return "type, key or dtype";
  if (a.reduce_op != b.reduce_op || a.root_rank != b.root_rank) return "reduce op or root";
  if (std::memcmp(&a.prescale, &b.prescale, 8) != 0 ||
      std::memcmp(&a.postscale, &b.postscale, 8) != 0) {
    return "scale factors";
  }
  if (!(a.counts == b.counts) || a.first_dims != b.first_dims) return "counts or first dims";
  if (a.row_shape != b.row_shape || a.splits_matrix != b.splits_matrix) return "rows or splits";
  if (a.process_set != b.process_set || a.device != b.device) return "set or device";
  return "";
}

Outcome runAgreed(const std::string& in) {
  common::ByteReader reader(reinterpret_cast<const uint8_t*>(in.data()), in.size());
  uint8_t ranks = 0;
  if (!reader.u8(&ranks)) return rejected();
  const int n = 2 + ranks % 3;
  std::vector<std::vector<PostedOp>> posts(static_cast<size_t>(n));
  for (auto& post : posts) {
    uint16_t length = 0;
    std::string_view bytes;
    if (!reader.u16(&length) || !reader.rawView(&bytes, length)) return rejected();
    const auto* slot = reinterpret_cast<const uint8_t*>(bytes.data());
    if (!runtime::one_round::decodePost(slot, bytes.size(), kRound, &post).isOk()) {
      return rejected();
    }
  }
  const PostedOp* mine = nullptr;
  for (const PostedOp& op : posts[0]) {
    if (op.kind == PostKind::kData && mine == nullptr) mine = &op;
  }
  if (mine == nullptr) return rejected();
  // What OneRound::finish checks before it asks for a response (Note [One round] B).
  std::vector<const PostedOp*> ops;
  for (const auto& post : posts) {
    const PostedOp* theirs = dataOp(post, mine->name);
    if (theirs == nullptr || !runtime::one_round::sameParams(*theirs, *mine)) return rejected();
    ops.push_back(theirs);
  }
  if (mine->type == coord::OpType::kBroadcast) {
    if (mine->root_rank < 0 || mine->root_rank >= n ||
        ops[static_cast<size_t>(mine->root_rank)]->data == nullptr) {
      return rejected();
    }
  } else {
    for (const PostedOp* op : ops) {
      if (op->data == nullptr) return rejected();
    }
  }
  std::vector<int> members;
  for (int r = 0; r < n; ++r) members.push_back(r);
  std::vector<coord::Request> scratch;
  const coord::Key key{3, 1};
  coord::Response direct, reference;
  const bool ok = runtime::one_round::respond(*mine, ops, key, members, &scratch, &direct);
  const bool want =
      runtime::one_round::respondByValidation(*mine, ops, key, members, &scratch, &reference);
  if (ok != want) {
    return failed(std::string("the direct response ") + (ok ? "accepts" : "refuses") +
                  " what validation " + (want ? "accepts" : "refuses") + " (" +
                  (want ? "" : reference.error) + ")");
  }
  if (!ok) return rejected();
  const std::string field = differs(direct, reference);
  return field.empty() ? accepted() : failed("the direct response differs in " + field);
}

}  // namespace

void addRuntimeTargets(std::vector<Target>* out) {
  out->push_back({"one_round_post", "runtime::one_round::decodePost", postSeeds, runPost});
  out->push_back({"one_round_respond", "runtime::one_round::respond", agreedSeeds, runAgreed});
}

}  // namespace hvd::fuzz
