// Point-to-point message headers (transport/peer_frame.h).
#include "transport/peer_frame.h"

#include "common/byte_codec.h"

namespace hvd::transport {

using common::Status;

bool peerPayloadBytes(common::DataType dtype, const std::vector<int64_t>& shape,
                      uint64_t* bytes) {
  uint64_t total = common::dataTypeSize(dtype);
  for (int64_t d : shape) {
    if (d < 0) return false;
    if (d != 0 && total > kMaxPeerPayloadBytes / static_cast<uint64_t>(d)) return false;
    total *= static_cast<uint64_t>(d);
  }
  *bytes = total;
  return true;
}

std::string encodePeerHeader(const PeerFrame& frame) {
  std::string header;
  common::ByteWriter w(&header);
  w.u32(kPeerFrameMagic);
  w.i64(frame.tag);
  w.u8(static_cast<uint8_t>(frame.dtype));
  w.i64s(frame.shape);
  w.u64(frame.bytes);
  std::string out;
  common::ByteWriter prefix(&out);
  prefix.u32(static_cast<uint32_t>(header.size()));
  out += header;
  return out;
}

Status decodePeerHeader(const void* data, size_t size, PeerFrame* out) {
  const auto bad = [](const std::string& what) {
    return common::internalError("malformed point-to-point header: " + what);
  };
  common::ByteReader in(data, size);
  uint32_t magic = 0;
  uint8_t dtype = 0;
  if (!in.u32(&magic)) return bad(in.error());
  if (magic != kPeerFrameMagic) return bad("bad magic");
  if (!in.i64(&out->tag) || !in.u8(&dtype)) return bad(in.error());
  if (!common::isValidDataType(dtype)) return bad("unknown dtype code " + std::to_string(dtype));
  out->dtype = static_cast<common::DataType>(dtype);
  if (!in.sizes(&out->shape) || !in.u64(&out->bytes)) return bad(in.error());
  if (out->shape.size() > kMaxPeerDims) {
    return bad(std::to_string(out->shape.size()) + " dimensions (at most " +
               std::to_string(kMaxPeerDims) + ")");
  }
  uint64_t expected = 0;
  if (!peerPayloadBytes(out->dtype, out->shape, &expected)) return bad("shape too large");
  if (expected != out->bytes) {
    return bad("payload of " + std::to_string(out->bytes) + " bytes for a shape of " +
               std::to_string(expected));
  }
  if (in.remaining() != 0) return bad(std::to_string(in.remaining()) + " trailing bytes");
  return Status::ok();
}

}  // namespace hvd::transport
