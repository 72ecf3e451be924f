// The header of one point-to-point message (transport/peer_channel.h): what a receiver needs
// to take a message it did not size in advance — its kind, tag, dtype and shape — and the
// payload length, checked against them. Encoded with common/byte_codec.h; decoded from bytes
// another process wrote, so every field is checked before it is used. Any thread (no shared
// state).
//
//   frame = u32 header bytes | header | payload
//   header = u32 magic 'HVDP' | u8 kind | i64 tag | u8 dtype | u32 ndim, ndim x i64 dims |
//            u64 payload bytes
//
// Kinds (Note [Device point-to-point] in runtime/device_peer_ops.cc has the device ones):
//   kHost: the payload is the tensor's bytes (dtype x shape).
//   kDevice: a CUDA tensor staged in the sender's exported device memory; the payload is a
//     DeviceMessage (below) saying where, and dtype x shape the tensor's bytes there.
//   kDeviceRead: the receiver finished copying device message `sequence` out (the payload, a
//     u64); the sender may reuse that memory. No dims, dtype uint8, tag 0.
//   kDeviceRefused: the same, for a message the receiver could not read (it cannot map the
//     sender's memory): the sender answers with kDeviceResend.
//   kDeviceResend: the bytes of refused message `sequence` (in the tag field, >= 0) through
//     host memory: dtype uint8, one dim, the payload.
//   kNcclId: the sender's NCCL unique id (kNcclIdBytes) for the communicator of its CUDA
//     messages to this receiver; sent once, before its first kDeviceNccl. No dims, uint8, tag 0.
//   kDeviceNccl: a CUDA tensor the sender passes to ncclSend (Note [NCCL point-to-point] in
//     runtime/device_nccl_peers.cc): dtype x shape say its bytes; no payload.
//   The split copy of a large host message between ranks of one host (Note [Split copy] in
//   transport/peer_split.cc; the channel's own, PeerOps never sees them):
//   kSplitOffer: a kHost message of dtype x shape (tag as kHost) whose bytes wait in the
//     sender's memory; the payload, a SplitEndpoint, says where.
//   kSplitAccept: the receiver's answer: a SplitEndpoint (address 0: send this one whole through
//     the ring; identity_address 0 too: and every later one).
//   kSplitDone: the sender wrote its half (payload u64 1), or will not (0: read it all).
//   kSplitRead: the receiver has every byte; the sender's memory is its own again. No payload.
//   kSplitReadAll: the receiver's other answer: it reads every byte itself (a posted out=,
//     which only its own process writes); the sender writes nothing and waits for the Read.
//     No payload.
//   Accept, Done, Read and ReadAll: no dims, dtype uint8, tag 0.
//   kRefused: the receiver took message `ordinal` (the payload's u64: its number among the
//     sender's kHost, kDevice and kDeviceNccl messages to it, from 0) of tag `tag` (>= 0) into
//     an out= of another dtype or shape; then `reason`, 1 to kMaxRefusalTextBytes printable
//     ASCII bytes. No dims, dtype uint8 (Note [Refused messages] in runtime/peer_ops_into.cc).
//   The one-round board between ranks off one shared segment (Note [One round] K in
//   runtime/one_round.cc; PeerOps hands them to the board, never to a receive):
//   kBoardPost: the sender's post of round `tag` (>= 1): 1 to kBoardSlotBytes bytes, decoded
//     by one_round::decodePost. No dims, dtype uint8.
//   kBoardState: the sender's board state word (BoardHeader::state): a u64. No dims, dtype
//     uint8, tag 0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace hvd::transport {

constexpr uint32_t kPeerFrameMagic = 0x50445648;  // "HVDP" little-endian
constexpr size_t kMaxPeerHeaderBytes = 1024;  // 4 + 1 + 8 + 1 + 4 + 8 x 100 dims + 8
constexpr uint32_t kMaxPeerDims = 100;
constexpr uint64_t kMaxPeerPayloadBytes = 1ull << 40;

enum class PeerFrameKind : uint8_t {
  kHost = 0, kDevice = 1, kDeviceRead = 2, kDeviceRefused = 3, kDeviceResend = 4, kNcclId = 5,
  kDeviceNccl = 6, kSplitOffer = 7, kSplitAccept = 8, kSplitDone = 9, kSplitRead = 10,
  kSplitReadAll = 11, kRefused = 12, kBoardPost = 13, kBoardState = 14
};

struct PeerFrame {
  PeerFrameKind kind = PeerFrameKind::kHost;
  int64_t tag = 0;
  common::DataType dtype = common::DataType::kUint8;
  std::vector<int64_t> shape;
  uint64_t bytes = 0;  // the payload's: kHost product(shape) x dtype size; see the kinds
};

// Where a kDevice message's bytes wait: at `offset` in the sender's exported segment
// `segment` (`segment_bytes` long, opened from `memory` at `base_offset` into the block the
// handle maps: Note [IPC sub-allocation] in transport/cuda/ipc_peers.cc), final once `event`
// (an interprocess event) fired. `sequence` numbers the sender's device messages to this
// receiver; the kDeviceRead frame names it.
struct DeviceMessage {
  uint64_t sequence = 0;
  uint64_t segment = 0;
  uint64_t segment_bytes = 0;
  uint64_t base_offset = 0;
  uint64_t offset = 0;
  char memory[64] = {};  // cudaIpcMemHandle_t
  char event[64] = {};   // cudaIpcEventHandle_t
};
constexpr uint64_t kDeviceMessageBytes = 5 * 8 + 64 + 64;
constexpr uint64_t kDeviceReadBytes = 8;
constexpr uint64_t kNcclIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES

// A process and an address in it, and where that process keeps its identity word (and the
// word's value): a kSplitOffer's and a kSplitAccept's payload.
struct SplitEndpoint {
  uint64_t pid = 0;
  uint64_t address = 0;
  uint64_t identity_address = 0;
  uint64_t identity_value = 0;
};
constexpr uint64_t kSplitEndpointBytes = 4 * 8;
constexpr uint64_t kSplitDoneBytes = 8;
constexpr uint64_t kMaxRefusalTextBytes = 1024;
constexpr uint64_t kRefusalOrdinalBytes = 8;  // the u64 before the reason
constexpr uint64_t kBoardPostMaxBytes = 32 << 10;  // shm::kBoardSlotBytes (checked there)
constexpr uint64_t kBoardStateBytes = 8;


// The whole frame prefix: u32 header bytes, then the header. The payload follows it.
std::string encodePeerHeader(const PeerFrame& frame);

// The payload bytes `shape` and `dtype` describe; false when a dimension is negative or the
// product overflows kMaxPeerPayloadBytes.
bool peerPayloadBytes(common::DataType dtype, const std::vector<int64_t>& shape, uint64_t* bytes);

// Decodes a header (the bytes after its u32 length). kInternal naming the first bad field:
// magic, kind, dtype, dims (count, negative, overflow), or a payload length that disagrees
// with them.
common::Status decodePeerHeader(const void* data, size_t size, PeerFrame* out);

// A kDevice frame's payload, and a kDeviceRead frame's.
std::string encodeDeviceMessage(const DeviceMessage& message);
// kInternal unless `size` is kDeviceMessageBytes and the tensor's `tensor_bytes` (> 0) lie
// inside the segment as claimed (offset + bytes <= segment_bytes, without overflow); the
// receiver checks the claim against what it mapped (transport/cuda/ipc_messages.h).
common::Status decodeDeviceMessage(const void* data, size_t size, uint64_t tensor_bytes,
                                   DeviceMessage* out);
std::string encodeDeviceRead(uint64_t sequence);
common::Status decodeDeviceRead(const void* data, size_t size, uint64_t* sequence);
std::string encodeSplitEndpoint(const SplitEndpoint& endpoint);
// kInternal unless `size` is kSplitEndpointBytes and the pid fits a pid_t.
common::Status decodeSplitEndpoint(const void* data, size_t size, SplitEndpoint* out);
// A kRefused frame's payload; `reason` is cut to kMaxRefusalTextBytes, its bytes outside
// printable ASCII made '?'.
std::string encodeRefusal(uint64_t ordinal, const std::string& reason);
// kInternal unless `size` is 8 + 1..kMaxRefusalTextBytes and every text byte is printable.
common::Status decodeRefusal(const void* data, size_t size, uint64_t* ordinal,
                             std::string* reason);

}  // namespace hvd::transport
