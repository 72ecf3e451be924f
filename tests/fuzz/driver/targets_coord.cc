// The negotiation decoders (coord/message.h, coord/response_cache.h) and the byte codec under
// them (common/byte_codec.h). Their formats are canonical (fixed widths, exact lengths, flags
// 0 or 1), so an accepted input must re-encode to exactly its own bytes; the cached request
// lists instead replay through a sender cache and a second mirror (Note [Request cache mirror])
// and must decode to the same requests.
#include <algorithm>
#include <cstring>
#include <memory>

#include "common/byte_codec.h"
#include "coord/key_table.h"
#include "coord/message.h"
#include "coord/response_cache.h"
#include "fuzz.h"

namespace hvd::fuzz {
namespace {

using coord::Request;
using coord::Response;

std::string randomName(Rng& rng) {
  static const char kChars[] = "abcdefghijklmnopqrstuvwxyz0123456789._/";
  std::string name = rng.chance(8) ? "" : "grad.";
  for (uint64_t n = rng.below(12); n > 0; --n) name += kChars[rng.below(sizeof(kChars) - 1)];
  return name;
}

double randomScale(Rng& rng) {
  if (rng.chance(4)) return 1.0;
  const uint64_t bits = rng.next();
  double d;
  std::memcpy(&d, &bits, sizeof(d));  // any bit pattern: NaN and infinities travel too
  return d;
}

std::vector<int64_t> randomSizes(Rng& rng, size_t n) {
  std::vector<int64_t> v(n);
  for (int64_t& x : v) x = static_cast<int64_t>(rng.below(rng.chance(8) ? 1ull << 40 : 64));
  return v;
}

Request randomRequest(Rng& rng) {
  Request r;
  r.request_rank = static_cast<int32_t>(rng.below(8));
  r.type = static_cast<coord::OpType>(rng.below(7));
  r.name = randomName(rng);
  r.dtype = static_cast<common::DataType>(rng.below(common::kNumDataTypes));
  for (int64_t d : randomSizes(rng, rng.below(5))) r.shape.push_back(d % 4096);
  r.reduce_op = static_cast<common::ReduceOp>(rng.below(6));
  r.prescale = randomScale(rng);
  r.postscale = randomScale(rng);
  r.root_rank = static_cast<int32_t>(rng.below(8));
  r.process_set = static_cast<int32_t>(rng.below(3));
  r.group_id = static_cast<int32_t>(rng.below(4)) - 1;
  r.device = static_cast<int32_t>(rng.below(3)) - 1;
  if (r.type == coord::OpType::kAlltoall) r.splits = randomSizes(rng, rng.below(4));
  return r;
}

// A Response that passes decode's cross-field checks (message.cc checkShape).
Response randomResponse(Rng& rng, coord::KeyTable& keys) {
  Response r;
  r.status = static_cast<coord::ResponseType>(rng.below(2));
  r.type = static_cast<coord::OpType>(rng.below(7));
  r.process_set = static_cast<int32_t>(rng.below(3));
  const size_t names = rng.below(4);
  for (size_t i = 0; i < names; ++i) r.keys.push_back(keys.intern(r.process_set, randomName(rng)));
  if (r.status == coord::ResponseType::kError) r.error = "rank 1 sent float32, rank 0 int64";
  r.dtype = static_cast<common::DataType>(rng.below(common::kNumDataTypes));
  r.reduce_op = static_cast<common::ReduceOp>(rng.below(6));
  r.prescale = randomScale(rng);
  r.postscale = randomScale(rng);
  r.root_rank = static_cast<int32_t>(rng.below(8));
  r.device = static_cast<int32_t>(rng.below(3)) - 1;
  size_t dims = 0;
  for (size_t i = 0; i < names && (names > 0 && rng.below(3) != 0); ++i) {
    r.counts.push_back(static_cast<int64_t>(rng.below(3)));
    dims += static_cast<size_t>(r.counts.back());
  }
  if (r.counts.size() != names) r.counts.clear();
  if (r.type == coord::OpType::kAllgather && r.status == coord::ResponseType::kOk && names > 0) {
    r.counts.clear();
    dims = 0;
    for (size_t i = 0; i < names; ++i) {
      r.counts.push_back(static_cast<int64_t>(rng.below(3)));
      dims += static_cast<size_t>(r.counts.back());
    }
    r.first_dims = randomSizes(rng, names * rng.below(4));
  }
  r.row_shape = randomSizes(rng, r.type == coord::OpType::kAllgather ? dims : rng.below(3));
  const size_t side = rng.below(4);
  r.splits_matrix = randomSizes(rng, side * side);
  r.last_joined_rank = static_cast<int32_t>(rng.below(4)) - 1;
  return r;
}

std::string hexOf(const std::string& s, size_t limit = 48) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < s.size() && i < limit; ++i) {
    out += kHex[static_cast<unsigned char>(s[i]) >> 4];
    out += kHex[static_cast<unsigned char>(s[i]) & 15];
  }
  return out;
}

Outcome sameBytes(const std::string& input, const std::string& again, const char* what) {
  if (again == input) return accepted();
  return failed(std::string(what) + " re-encodes differently: " + hexOf(again) + " vs " +
                hexOf(input));
}

bool isMalformed(const common::Status& s) {
  return s.code() == common::Code::kInternal && s.message().rfind("malformed", 0) == 0;
}

Outcome requestList(const std::string& input) {
  coord::RequestList list;
  const common::Status s = coord::decode(input, &list);
  if (!s.isOk()) return isMalformed(s) ? rejected() : failed("status " + s.message());
  return sameBytes(input, coord::encode(list), "RequestList");
}

// The cache matches scales by value (sameRequestParams), so -0.0 may come back as 0.0.
std::string encodeSignless(coord::RequestList list) {
  for (Request& r : list.requests) {
    if (r.prescale == 0) r.prescale = 0.0;
    if (r.postscale == 0) r.postscale = 0.0;
  }
  return coord::encode(list);
}

// A worker's stream of cached lists, as rank 0 reads them from one worker: the input is
// several lists, each after a u16 length (the last may run short), decoded in order by one
// mirror. Every list that decodes is sent again through a sender cache and decoded by a second
// mirror: the two must agree whatever the first stream held.
Outcome cachedRequestStream(const std::string& input) {
  coord::RequestCache mirror(4), sender(4), second_mirror(4);  // small: every few requests evict
  common::ByteReader in(input);
  uint16_t length = 0;
  while (in.u16(&length)) {
    std::string_view part;
    in.rawView(&part, std::min<size_t>(length, in.remaining()));
    coord::RequestList list;
    const common::Status s = coord::decodeRequests(std::string(part), &mirror, &list);
    if (!s.isOk()) {  // Note [Request cache mirror] (c): the session ends here
      return isMalformed(s) ? rejected() : failed("status " + s.message());
    }
    std::vector<const Request*> ptrs;
    for (const Request& r : list.requests) ptrs.push_back(&r);
    const std::string resent = coord::encodeRequests(ptrs.data(), ptrs.size(), &sender);
    coord::RequestList again;
    const common::Status s2 = coord::decodeRequests(resent, &second_mirror, &again);
    if (!s2.isOk()) return failed("the list sent again does not decode: " + s2.message());
    if (encodeSignless(again) != encodeSignless(list)) return failed("the cache replay differs");
  }
  return in.atEnd() ? accepted() : rejected();  // a lone trailing byte: no length
}

std::vector<std::string> cachedSeeds(Rng& rng) {
  std::vector<std::string> seeds;
  for (int i = 0; i < 24; ++i) {
    coord::RequestCache sender(4);
    std::vector<Request> pool;
    for (int k = 0; k < 6; ++k) pool.push_back(randomRequest(rng));
    std::string stream;
    common::ByteWriter w(&stream);
    for (uint64_t lists = 1 + rng.below(4); lists > 0; --lists) {
      std::vector<const Request*> ptrs;
      for (uint64_t n = rng.below(5); n > 0; --n) ptrs.push_back(&pool[rng.below(pool.size())]);
      const std::string list = coord::encodeRequests(ptrs.data(), ptrs.size(), &sender);
      w.u16(static_cast<uint16_t>(list.size()));
      w.bytes(list.data(), list.size());
    }
    seeds.push_back(stream);
  }
  return seeds;
}

struct ResponseDecoder {
  coord::KeyTable keys;
  Outcome run(const std::string& input) {
    if (keys.wantsSweep()) keys.sweep([](const coord::KeyTable::MarkFn&) {});
    coord::ResponseList list;
    const common::Status s = coord::decode(input, keys, &list);
    if (!s.isOk()) return isMalformed(s) ? rejected() : failed("status " + s.message());
    return sameBytes(input, coord::encode(list, keys), "ResponseList");
  }
};

std::vector<std::string> responseSeeds(Rng& rng) {
  coord::KeyTable keys;
  std::vector<std::string> seeds;
  for (int i = 0; i < 48; ++i) {
    coord::ResponseList list;
    for (uint64_t n = rng.below(4); n > 0; --n) list.responses.push_back(randomResponse(rng, keys));
    if (rng.chance(2)) {
      coord::ParamsUpdate p;
      p.fusion_threshold_bytes = static_cast<int64_t>(rng.below(1ull << 30));
      p.cycle_time_ms = static_cast<double>(rng.below(100)) / 4;
      p.cache_enabled = rng.chance(2);
      p.hierarchical_allreduce = rng.chance(2);
      p.phase = static_cast<int32_t>(rng.below(4));
      p.trial = static_cast<int32_t>(rng.below(30));
      p.trials = static_cast<int32_t>(rng.below(30));
      list.params = p;
    }
    seeds.push_back(coord::encode(list, keys));
  }
  return seeds;
}

// The byte codec itself: the input is a program of reads (an op byte, then the field it
// names) run until a read fails or the input ends; the values read, written back with
// ByteWriter, must give back exactly the bytes consumed.
Outcome byteReader(const std::string& input) {
  common::ByteReader in(input);
  std::string again;
  common::ByteWriter w(&again);
  uint8_t op = 0;
  while (in.u8(&op)) {
    w.u8(op);
    bool ok = false;
    switch (op % 10) {
      case 0: { uint16_t v; ok = in.u16(&v); if (ok) w.u16(v); break; }
      case 1: { uint32_t v; ok = in.u32(&v); if (ok) w.u32(v); break; }
      case 2: { int64_t v; ok = in.i64(&v); if (ok) w.i64(v); break; }
      case 3: { double v; ok = in.f64(&v); if (ok) w.f64(v); break; }
      case 4: { std::string v; ok = in.str(&v, 1u << 16); if (ok) w.str(v); break; }
      case 5: { std::string_view v; ok = in.str(&v, 64); if (ok) w.str(std::string(v)); break; }
      case 6: { std::vector<int64_t> v; ok = in.sizes(&v); if (ok) w.i64s(v); break; }
      case 7: {
        common::SmallVector<int64_t, 2> v;
        ok = in.sizes(&v);
        if (ok) w.i64s(v);
        break;
      }
      case 8: { int32_t v; ok = in.ranged(&v, -3, 1 << 20, "field"); if (ok) w.i32(v); break; }
      default: {
        uint32_t n = 0;
        std::string_view v;
        ok = in.count(&n, 1) && in.rawView(&v, n % 64);
        if (ok) { w.u32(n); w.bytes(v.data(), v.size()); }
      }
    }
    if (!ok) {
      if (in.error().empty()) return failed("a failed read recorded no error");
      return input.compare(0, again.size(), again) == 0 ? rejected()
                                                        : failed("bytes read back differ");
    }
  }
  return sameBytes(input, again, "byte program");
}

std::vector<std::string> byteSeeds(Rng& rng) {
  std::vector<std::string> seeds;
  for (int i = 0; i < 32; ++i) {
    std::string s;
    common::ByteWriter w(&s);
    for (uint64_t n = 1 + rng.below(8); n > 0; --n) {
      const uint8_t op = static_cast<uint8_t>(rng.below(10));
      w.u8(op);
      if (op == 0) w.u16(static_cast<uint16_t>(rng.next()));
      if (op == 1) w.u32(static_cast<uint32_t>(rng.next()));
      if (op == 2) w.i64(static_cast<int64_t>(rng.next()));
      if (op == 3) w.f64(randomScale(rng));
      if (op == 4 || op == 5) w.str(randomName(rng));
      if (op == 6 || op == 7) w.i64s(randomSizes(rng, rng.below(4)));
      if (op == 8) w.i32(static_cast<int32_t>(rng.below(100)));
      if (op == 9) { w.u32(3); w.bytes("abc", 3); }
    }
    seeds.push_back(s);
  }
  return seeds;
}

}  // namespace

void addCoordTargets(std::vector<Target>* out) {
  out->push_back({"request_list", "coord::decode(RequestList) (no cache)",
                  [](Rng& rng) {
                    std::vector<std::string> seeds;
                    for (int i = 0; i < 48; ++i) {
                      coord::RequestList list;
                      for (uint64_t n = rng.below(4); n > 0; --n) list.requests.push_back(randomRequest(rng));
                      seeds.push_back(coord::encode(list));
                    }
                    return seeds;
                  },
                  requestList});
  out->push_back({"request_list_cached", "coord::decodeRequests with a RequestCache mirror",
                  cachedSeeds, cachedRequestStream});
  auto responses = std::make_shared<ResponseDecoder>();
  out->push_back({"response_list", "coord::decode(ResponseList) into a KeyTable", responseSeeds,
                  [responses](const std::string& in) { return responses->run(in); }});
  out->push_back({"byte_reader", "common::ByteReader (every read) against ByteWriter",
                  byteSeeds, byteReader});
}

}  // namespace hvd::fuzz
