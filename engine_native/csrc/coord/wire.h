// The negotiation messages' shared wire pieces over the byte codec (common/byte_codec.h): the
// list tags, the length limits of names and error text, and the full form of a Request.
// Used by message.cc and request_cache.cc only; any thread (no shared state).
#pragma once

#include <cstdint>
#include <string>

#include "common/byte_codec.h"
#include "coord/message.h"

namespace hvd::coord::wire {

constexpr uint32_t kMaxNameBytes = 64 * 1024;    // tensor names
constexpr uint32_t kMaxErrorBytes = 1u << 20;    // error text in a Response
constexpr uint8_t kRequestListTag = 0x51;        // 'Q': first byte of an encoded RequestList
constexpr uint8_t kResponseListTag = 0x52;       // 'R': first byte of an encoded ResponseList

// Every field of a Request, in declaration order (the "full" form of a request on the wire).
void writeRequest(common::ByteWriter& w, const Request& r, const std::string& name);
bool readRequest(common::ByteReader& r, Request* out);

}  // namespace hvd::coord::wire
