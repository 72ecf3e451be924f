// TimelineRecord: the fixed-size POD unit that crosses the SPSC ring from the recording thread
// (background loop) to the timeline writer thread. Strings travel as ids of an interned table
// (a kDefine record group carries the text once); variable data (shape dims, string text) rides
// in the record's payload plus `extra` raw continuation slots published in the same commit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace hvd::timeline {

enum class RecordKind : uint8_t {
  kDefine,          // name = string id; data = the text (first chunk of it, rest in extras)
  kNegotiateStart,  // name, label = op
  kRankReady,       // name, value = rank
  kNegotiateEnd,    // name
  kOpStart,         // name, label = op, value = dtype code; data = int64 shape dims
  kActivityStart,   // name, label = activity
  kActivityEnd,     // name
  kOpEnd,           // name, label = error text id or kNoString
  kCycle,           // no name
  // A response executed as one unit (Timeline::beginGroup): the kOpStart records that follow
  // name its members; activities and the end then apply to every member at once.
  kGroupBegin,          // label = op
  kGroupActivityStart,  // label = activity
  kGroupActivityEnd,    // -
  kGroupEnd,            // label = error text id or kNoString
};

constexpr uint32_t kNoString = 0xffffffffu;
constexpr size_t kRecordBytes = 64;
constexpr size_t kInlineBytes = 32;

struct TimelineRecord {
  int64_t ts_ns;       // steady clock at the recording call
  uint32_t session;    // file session current at the recording call (0: none)
  RecordKind kind;
  uint8_t extra;       // continuation slots that follow, holding raw data bytes
  uint16_t reserved;
  uint32_t name;       // tensor name id
  uint32_t label;      // op / activity / error id
  int32_t value;       // rank or dtype code
  uint32_t data_bytes; // bytes of data in payload + extras
  unsigned char payload[kInlineBytes];
};
static_assert(sizeof(TimelineRecord) == kRecordBytes, "records are one cache line");

// How many continuation slots `bytes` of data need beyond the inline payload.
inline size_t extraSlotsFor(size_t bytes) {
  return bytes <= kInlineBytes ? 0 : (bytes - kInlineBytes + kRecordBytes - 1) / kRecordBytes;
}

}  // namespace hvd::timeline
