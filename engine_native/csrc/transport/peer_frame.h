// The header of one point-to-point message (transport/peer_channel.h): what a receiver needs
// to take a message it did not size in advance — its tag, dtype and shape — and the payload
// length, checked against them. Encoded with common/byte_codec.h; decoded from bytes another
// process wrote, so every field is checked before it is used. Any thread (no shared state).
//
//   frame = u32 header bytes | header | payload
//   header = u32 magic 'HVDP' | i64 tag | u8 dtype | u32 ndim, ndim x i64 dims | u64 payload bytes
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace hvd::transport {

constexpr uint32_t kPeerFrameMagic = 0x50445648;  // "HVDP" little-endian
constexpr size_t kMaxPeerHeaderBytes = 1024;      // 4 + 8 + 1 + 4 + 8 x 100 dims + 8
constexpr uint32_t kMaxPeerDims = 100;
constexpr uint64_t kMaxPeerPayloadBytes = 1ull << 40;

struct PeerFrame {
  int64_t tag = 0;
  common::DataType dtype = common::DataType::kUint8;
  std::vector<int64_t> shape;
  uint64_t bytes = 0;  // = product(shape) x dtype size
};

// The whole frame prefix: u32 header bytes, then the header. The payload follows it.
std::string encodePeerHeader(const PeerFrame& frame);

// The payload bytes `shape` and `dtype` describe; false when a dimension is negative or the
// product overflows kMaxPeerPayloadBytes.
bool peerPayloadBytes(common::DataType dtype, const std::vector<int64_t>& shape, uint64_t* bytes);

// Decodes a header (the bytes after its u32 length). kInternal naming the first bad field:
// magic, dtype, dims (count, negative, overflow), or a payload length that disagrees with them.
common::Status decodePeerHeader(const void* data, size_t size, PeerFrame* out);

}  // namespace hvd::transport
