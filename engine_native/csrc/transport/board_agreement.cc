// The one-round board's size limit across hosts (transport/board_agreement.h).
#include "transport/board_agreement.h"

#include <algorithm>
#include <string>

#include "common/byte_codec.h"

namespace hvd::transport {

using common::Status;

Status agreeBoardBytes(const std::vector<int>& ranks, const std::vector<int>& fds, uint32_t mine,
                       uint32_t max_bytes, tcp::Deadline deadline, uint32_t* agreed) {
  std::string wish;
  common::ByteWriter(&wish).u32(mine);
  for (size_t i = 0; i < fds.size(); ++i) {  // all writes first: 4 bytes never block a peer
    Status s = tcp::writeFull(fds[i], wish.data(), wish.size(), deadline);
    if (!s.isOk()) {
      return Status(s.code(), "one-round board setup: rank " + std::to_string(ranks[i]) + ": " +
                                  s.message());
    }
  }
  *agreed = mine;
  for (size_t i = 0; i < fds.size(); ++i) {
    uint8_t bytes[4] = {};
    Status s = tcp::readFull(fds[i], bytes, sizeof(bytes), deadline);
    if (!s.isOk()) {
      return Status(s.code(), "one-round board setup: rank " + std::to_string(ranks[i]) + ": " +
                                  s.message());
    }
    uint32_t theirs = 0;
    common::ByteReader in(bytes, sizeof(bytes));
    if (!in.u32(&theirs) || theirs > max_bytes) {
      return common::internalError("one-round board setup: rank " + std::to_string(ranks[i]) +
                                   " asked for " + std::to_string(theirs) + " bytes (at most " +
                                   std::to_string(max_bytes) + "): not a rank of this job's code");
    }
    *agreed = std::min(*agreed, theirs);
  }
  return Status::ok();
}

}  // namespace hvd::transport
