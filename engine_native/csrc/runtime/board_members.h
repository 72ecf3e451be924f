// BoardMembers: every rank's part of the one-round board as this rank sees it (Note [One
// round] K in runtime/one_round.cc). A rank of this host's collective segment is read there,
// as it writes it; any other rank (on another host, or on this one without a segment) through
// a mirror that its kBoardPost and kBoardState frames fill, in the order it sent them. Off a
// segment, this rank's own part lives here too. Background thread only (whichever thread holds
// the loop's progress_).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "transport/mesh.h"
#include "transport/peer_channel.h"
#include "transport/shm/collective_segment.h"

namespace hvd::runtime {

class BoardMembers {
 public:
  using Header = transport::shm::BoardHeader;

  explicit BoardMembers(const transport::Mesh& mesh);

  // Reached by frames (its mirror is read), not through the segment.
  bool remote(int rank) const { return mirrors_[static_cast<size_t>(rank)] != nullptr &&
                                       rank != me_; }
  const std::vector<int>& remotes() const { return remotes_; }
  const Header& header(int rank) const;
  Header& ownHeader() const { return const_cast<Header&>(header(me_)); }
  // `rank`'s post of `round` (its slot round % 2) and how many bytes it may span.
  const uint8_t* post(int rank, uint64_t round, size_t* bytes) const;
  uint8_t* ownSlot(uint64_t round);  // kBoardSlotBytes

  // A kBoardPost or kBoardState frame from `rank`, filed in its mirror once checked: a post
  // of a later round than its last, while its board is open; a state later than its last.
  common::Status arrived(int rank, const transport::PeerMessage& message);

 private:
  struct Mirror {
    Header header;
    transport::PeerPayload posts[2];  // round % 2
    uint64_t bytes[2] = {0, 0};
    std::vector<uint8_t> own;         // this rank's slots, off a segment
  };

  int me_;
  transport::shm::CollectiveSegment* segment_;
  std::vector<int> local_;                        // by rank: index in the segment, or -1
  std::vector<std::unique_ptr<Mirror>> mirrors_;  // by rank: off the segment (self: own part)
  std::vector<int> remotes_;
};

}  // namespace hvd::runtime
