// Every rank's part of the one-round board (runtime/board_members.h; Note [One round] K in
// runtime/one_round.cc).
#include "runtime/board_members.h"

#include <string>

#include "common/byte_codec.h"

namespace hvd::runtime {

using common::Status;
using transport::shm::kBoardGone;
using transport::shm::kBoardSlotBytes;

static_assert(transport::kBoardPostMaxBytes == kBoardSlotBytes,
              "a post frame carries at most one slot");

BoardMembers::BoardMembers(const transport::Mesh& mesh)
    : me_(mesh.rank()), segment_(mesh.collectiveSegment()) {
  const int size = mesh.size();
  local_.assign(static_cast<size_t>(size), -1);
  mirrors_.resize(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    if (segment_ != nullptr) local_[static_cast<size_t>(r)] = mesh.hostIndexOf(r);
    if (local_[static_cast<size_t>(r)] >= 0) continue;
    auto mirror = std::make_unique<Mirror>();
    mirror->header.posted.store(0);
    mirror->header.state.store(0);
    mirror->header.wish.store(0);
    if (r == me_) {
      mirror->own.resize(2 * kBoardSlotBytes);
    } else {
      remotes_.push_back(r);
    }
    mirrors_[static_cast<size_t>(r)] = std::move(mirror);
  }
}

const BoardMembers::Header& BoardMembers::header(int rank) const {
  const int local = local_[static_cast<size_t>(rank)];
  if (local >= 0) return *segment_->boardHeader(local);
  return mirrors_[static_cast<size_t>(rank)]->header;
}

const uint8_t* BoardMembers::post(int rank, uint64_t round, size_t* bytes) const {
  const int local = local_[static_cast<size_t>(rank)];
  if (local >= 0) {
    *bytes = kBoardSlotBytes;
    return segment_->boardSlot(local, round);
  }
  const Mirror& m = *mirrors_[static_cast<size_t>(rank)];
  if (rank == me_) {
    *bytes = kBoardSlotBytes;
    return m.own.data() + (round % 2) * kBoardSlotBytes;
  }
  *bytes = static_cast<size_t>(m.bytes[round % 2]);
  return m.posts[round % 2].data;
}

uint8_t* BoardMembers::ownSlot(uint64_t round) {
  const int local = local_[static_cast<size_t>(me_)];
  if (local >= 0) return segment_->boardSlot(local, round);
  return mirrors_[static_cast<size_t>(me_)]->own.data() + (round % 2) * kBoardSlotBytes;
}

Status BoardMembers::arrived(int rank, const transport::PeerMessage& message) {
  const auto bad = [rank](const std::string& what) {
    return common::internalError("malformed one-round frame from rank " + std::to_string(rank) +
                                 ": " + what);
  };
  if (rank < 0 || rank >= static_cast<int>(mirrors_.size()) || !remote(rank)) {
    return bad("it reads this rank's board through shared memory");
  }
  Mirror& m = *mirrors_[static_cast<size_t>(rank)];
  const uint64_t state = m.header.state.load(std::memory_order_relaxed);
  if (message.frame.kind == transport::PeerFrameKind::kBoardState) {
    uint64_t next = 0;
    common::ByteReader in(message.payload.data, static_cast<size_t>(message.frame.bytes));
    if (!in.u64(&next)) return bad(in.error());
    // open in epoch E, closed in E, open in E + 1, ..., gone: each later than the last
    if (state == kBoardGone || next <= state) {
      return bad("state " + std::to_string(next) + " after " + std::to_string(state));
    }
    m.header.state.store(next, std::memory_order_seq_cst);
    return Status::ok();
  }
  const auto round = static_cast<uint64_t>(message.frame.tag);  // >= 1 (decodePeerHeader)
  const uint64_t last = m.header.posted.load(std::memory_order_relaxed);
  if (state == kBoardGone || (state & 1) != 0 || round <= last) {
    return bad("a post of round " + std::to_string(round) + " after round " +
               std::to_string(last) + (state == kBoardGone ? ", gone"
                                       : (state & 1) != 0 ? ", closed" : ""));
  }
  m.posts[round % 2] = message.payload;
  m.bytes[round % 2] = message.frame.bytes;
  m.header.posted.store(round, std::memory_order_seq_cst);
  return Status::ok();
}

}  // namespace hvd::runtime
