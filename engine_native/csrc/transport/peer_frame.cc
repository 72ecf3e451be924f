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
  w.u8(static_cast<uint8_t>(frame.kind));
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
  uint8_t kind = 0, dtype = 0;
  if (!in.u32(&magic)) return bad(in.error());
  if (magic != kPeerFrameMagic) return bad("bad magic");
  if (!in.u8(&kind)) return bad(in.error());
  if (kind > static_cast<uint8_t>(PeerFrameKind::kBoardState)) {
    return bad("unknown kind " + std::to_string(kind));
  }
  out->kind = static_cast<PeerFrameKind>(kind);
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
  if (out->kind == PeerFrameKind::kDevice) {
    expected = kDeviceMessageBytes;  // the tensor's bytes stay on the sender's device
  } else if (out->kind == PeerFrameKind::kDeviceNccl) {
    expected = 0;  // the tensor's bytes go by NCCL
  } else if (out->kind == PeerFrameKind::kDeviceRead ||
             out->kind == PeerFrameKind::kDeviceRefused || out->kind == PeerFrameKind::kNcclId) {
    if (!out->shape.empty() || out->dtype != common::DataType::kUint8 || out->tag != 0) {
      return bad("a read receipt or NCCL id with dims, a dtype or a tag");
    }
    expected = out->kind == PeerFrameKind::kNcclId ? kNcclIdBytes : kDeviceReadBytes;
  } else if (out->kind == PeerFrameKind::kSplitOffer) {
    if (expected == 0) return bad("a split offer of an empty tensor");
    expected = kSplitEndpointBytes;  // the tensor's bytes wait in the sender's memory
  } else if (out->kind == PeerFrameKind::kSplitAccept ||
             out->kind == PeerFrameKind::kSplitDone || out->kind == PeerFrameKind::kSplitRead ||
             out->kind == PeerFrameKind::kSplitReadAll) {
    if (!out->shape.empty() || out->dtype != common::DataType::kUint8 || out->tag != 0) {
      return bad("a split copy's answer with dims, a dtype or a tag");
    }
    expected = out->kind == PeerFrameKind::kSplitAccept ? kSplitEndpointBytes
               : out->kind == PeerFrameKind::kSplitDone ? kSplitDoneBytes
                                                        : 0;
  } else if (out->kind == PeerFrameKind::kRefused) {
    if (!out->shape.empty() || out->dtype != common::DataType::kUint8 || out->tag < 0) {
      return bad("a refusal with dims, a dtype or a negative tag");
    }
    if (out->bytes <= kRefusalOrdinalBytes ||
        out->bytes > kRefusalOrdinalBytes + kMaxRefusalTextBytes) {
      return bad("a refusal of " + std::to_string(out->bytes) + " bytes");
    }
    expected = out->bytes;  // the payload's own decoder checks the rest
  } else if (out->kind == PeerFrameKind::kBoardPost || out->kind == PeerFrameKind::kBoardState) {
    const bool post = out->kind == PeerFrameKind::kBoardPost;
    if (!out->shape.empty() || out->dtype != common::DataType::kUint8 ||
        (post ? out->tag < 1 : out->tag != 0)) {
      return bad("a one-round frame with dims, a dtype or a bad round");
    }
    if (post ? out->bytes == 0 || out->bytes > kBoardPostMaxBytes
             : out->bytes != kBoardStateBytes) {
      return bad("a one-round frame of " + std::to_string(out->bytes) + " bytes");
    }
    expected = out->bytes;  // a post's own decoder checks the rest
  } else if (out->kind == PeerFrameKind::kDeviceResend &&
             (out->shape.size() != 1 || out->dtype != common::DataType::kUint8 ||
              out->tag < 0)) {
    return bad("a resent device message that is not uint8 bytes of a sequence number");
  }
  if (expected != out->bytes) {
    return bad("payload of " + std::to_string(out->bytes) + " bytes for a shape of " +
               std::to_string(expected));
  }
  if (in.remaining() != 0) return bad(std::to_string(in.remaining()) + " trailing bytes");
  return Status::ok();
}

std::string encodeDeviceMessage(const DeviceMessage& message) {
  std::string out;
  common::ByteWriter w(&out);
  w.u64(message.sequence);
  w.u64(message.segment);
  w.u64(message.segment_bytes);
  w.u64(message.base_offset);
  w.u64(message.offset);
  w.bytes(message.memory, sizeof(message.memory));
  w.bytes(message.event, sizeof(message.event));
  return out;
}

Status decodeDeviceMessage(const void* data, size_t size, uint64_t tensor_bytes,
                           DeviceMessage* out) {
  const auto bad = [](const std::string& what) {
    return common::internalError("malformed device message: " + what);
  };
  if (size != kDeviceMessageBytes) return bad(std::to_string(size) + " bytes");
  common::ByteReader in(data, size);
  if (!in.u64(&out->sequence) || !in.u64(&out->segment) || !in.u64(&out->segment_bytes) ||
      !in.u64(&out->base_offset) || !in.u64(&out->offset) ||
      !in.bytes(out->memory, sizeof(out->memory)) || !in.bytes(out->event, sizeof(out->event))) {
    return bad(in.error());
  }
  if (tensor_bytes == 0) return bad("an empty tensor (sent as a host message)");
  if (out->offset > out->segment_bytes || tensor_bytes > out->segment_bytes - out->offset) {
    return bad(std::to_string(tensor_bytes) + " bytes at offset " +
               std::to_string(out->offset) + " of a " + std::to_string(out->segment_bytes) +
               "-byte segment");
  }
  if (out->base_offset > kMaxPeerPayloadBytes) return bad("segment offset out of range");
  return Status::ok();
}

std::string encodeDeviceRead(uint64_t sequence) {
  std::string out;
  common::ByteWriter w(&out);
  w.u64(sequence);
  return out;
}

Status decodeDeviceRead(const void* data, size_t size, uint64_t* sequence) {
  common::ByteReader in(data, size);
  if (size != kDeviceReadBytes || !in.u64(sequence)) {
    return common::internalError("malformed device read receipt: " + std::to_string(size) +
                                 " bytes");
  }
  return Status::ok();
}

std::string encodeSplitEndpoint(const SplitEndpoint& endpoint) {
  std::string out;
  common::ByteWriter w(&out);
  w.u64(endpoint.pid);
  w.u64(endpoint.address);
  w.u64(endpoint.identity_address);
  w.u64(endpoint.identity_value);
  return out;
}

Status decodeSplitEndpoint(const void* data, size_t size, SplitEndpoint* out) {
  common::ByteReader in(data, size);
  if (size != kSplitEndpointBytes || !in.u64(&out->pid) || !in.u64(&out->address) ||
      !in.u64(&out->identity_address) || !in.u64(&out->identity_value)) {
    return common::internalError("malformed split copy endpoint: " + std::to_string(size) +
                                 " bytes");
  }
  if (out->pid == 0 || out->pid > 0x7fffffffull) {
    return common::internalError("malformed split copy endpoint: pid " +
                                 std::to_string(out->pid));
  }
  return Status::ok();
}

std::string encodeRefusal(uint64_t ordinal, const std::string& reason) {
  std::string out;
  common::ByteWriter w(&out);
  w.u64(ordinal);
  std::string text = reason.empty() ? std::string("no reason given") : reason;
  if (text.size() > kMaxRefusalTextBytes) text.resize(kMaxRefusalTextBytes);
  for (char& c : text) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  return out + text;
}

Status decodeRefusal(const void* data, size_t size, uint64_t* ordinal, std::string* reason) {
  const auto bad = [](const std::string& what) {
    return common::internalError("malformed point-to-point refusal: " + what);
  };
  common::ByteReader in(data, size);
  if (size <= kRefusalOrdinalBytes || size > kRefusalOrdinalBytes + kMaxRefusalTextBytes ||
      !in.u64(ordinal)) {
    return bad(std::to_string(size) + " bytes");
  }
  const char* text = static_cast<const char*>(data) + kRefusalOrdinalBytes;
  const size_t length = size - kRefusalOrdinalBytes;
  for (size_t k = 0; k < length; ++k) {
    if (text[k] < 0x20 || text[k] > 0x7e) {
      return bad("byte " + std::to_string(static_cast<unsigned char>(text[k])) +
                 " in its reason");
    }
  }
  reason->assign(text, length);
  return Status::ok();
}

}  // namespace hvd::transport
