// Host collective segment (transport/shm/collective_segment.h).
//
// Layout: [header 64 B][per local rank: 4 lines = counters, doorbell, peer region (2)][slots of
// rank 0: depth x chunk_bytes][slots of rank 1]...[board of rank 0: BoardHeader line, two posts
// of kBoardSlotBytes][board of rank 1]... Counters and doorbell sit on their own cache lines:
// counters are written by their owner only, the doorbell by everyone; slots start on 64-byte
// boundaries (chunk_bytes is a multiple of 64).
//
// Note [Collective setup]
// Run by every rank of a host after the pair setup (Note [Shm setup]), over the authenticated
// data sockets, between the host's leader L (its lowest rank) and each other rank P:
//   F. L creates segmentName(job, 'c', L) sized for the host (if shm is wanted and creation
//      succeeds) and writes an Offer (transport/shm/offer.h, magic 'HVDC') to every P: ok,
//      the local size, the depth, the chunk bytes and the name.
//   G. P reads the offer; if both it and P want shm and the fields match what P computes
//      itself, P maps the segment. P writes an ack byte to L: 1 = mapped, 0 = not.
//      With the ack P sends one more byte, its SingleCopyWish (HVD_SINGLE_COPY and, under
//      auto, whether it would read a broadcast on two threads: Mesh decides). Before the ack
//      P writes its HVD_ONE_ROUND_BYTES into its BoardHeader (L does so before its verdict).
//   H. L reads every ack and writes a verdict (HostVerdict) to every P: mapped = 1 iff its own
//      offer was ok and every ack was 1; the least single-copy scope any rank's wish allows
//      (none < broadcasts < every op), the first rank (in host order, L first) whose wish set
//      it and that wish (for the reason metrics() gives); and L's HVD_SINGLE_COPY_MIN_BYTES.
//      P keeps its mapping iff mapped is 1. So the whole host agrees: an op uses the segment
//      on all of the host's ranks or on none (Note [Host pipeline]), an op reads peers
//      directly on all of them or on none, and the single-copy probe (Note [Single-copy
//      probe] in cross_memory.cc) runs on all of them or on none. It runs only where the scope
//      is not none: where a rank has HVD_SINGLE_COPY=0, or where under auto one would read on
//      one thread, init exchanges no probe message, so it adds no failure point there.
//   I. L unlinks the name: every rank has mapped it or given up, so no crash can leak it.
// Offers and verdicts are a few dozen bytes, so the socket buffers absorb all of L's writes.
#include "transport/shm/collective_segment.h"

#include <algorithm>

#include "common/byte_codec.h"
#include "common/logging.h"
#include "transport/shm/helper_read.h"
#include "transport/shm/offer.h"

namespace hvd::transport::shm {

using common::Status;

SingleCopyScope scopeOf(SingleCopyWish wish) {
  switch (wish) {
    case SingleCopyWish::kEveryOp: return SingleCopyScope::kEveryOp;
    case SingleCopyWish::kBroadcast: return SingleCopyScope::kBroadcast;
    case SingleCopyWish::kOff:
    case SingleCopyWish::kNotTwoThreads: break;
  }
  return SingleCopyScope::kNone;
}

// Under auto, broadcasts where this rank would read them on two threads (Note [Two-thread
// reads] in algo/broadcast_shm.cc) on the CPUs it will run on: its process's, or where it will
// be bound the smallest share binding gives a rank of the host (Note [CPU binding] A).
SingleCopyWish singleCopyWish(const std::string& setting, bool binds, int host_ranks,
                              bool cores_outnumbered) {
  if (setting == "on") return SingleCopyWish::kEveryOp;
  if (setting != "auto") return SingleCopyWish::kOff;  // "off" (Config parses no other value)
  int own = common::usableCores();
  if (binds && host_ranks > 1) own /= host_ranks;
  return readsOnTwoThreads(host_ranks, cores_outnumbered, own) ? SingleCopyWish::kBroadcast
                                                               : SingleCopyWish::kNotTwoThreads;
}

namespace {

constexpr uint64_t kCollectiveMagic = 0x35304c4f43445648ull;  // "HVDCOL05"
constexpr size_t kHeaderBytes = 64;
constexpr size_t kControlBytes = 4 * 64;  // per rank: counters, doorbell, peer region (2)
constexpr int kMaxLocalSize = 1024;
constexpr size_t kBoardBytes = 64 + 2 * kBoardSlotBytes;  // per rank
static_assert(sizeof(BoardHeader) <= 64, "a board header fits its line");

struct Header {
  uint64_t magic;
  uint32_t local_size;
  uint32_t depth;
  uint64_t chunk_bytes;
  uint64_t total_bytes;
};
static_assert(sizeof(Header) <= kHeaderBytes, "header must fit its slot");
static_assert(sizeof(std::atomic<uint64_t>) * kStageCount <= 64, "counters share one line");
static_assert(sizeof(PeerRegion) <= 128, "a peer region fits its two lines");

// Step H's verdict, L to every P. Wire: u8 mapped, u8 single-copy scope, u8 the limiting
// rank's wish, 1 byte 0, i32 the limiting rank (-1: none), u64 single_copy_min_bytes.
struct HostVerdict {
  uint8_t mapped = 0;
  SingleCopyScope scope = SingleCopyScope::kEveryOp;  // the least any rank of the host wished
  SingleCopyWish limit_wish = SingleCopyWish::kEveryOp;
  int32_t limit_rank = -1;  // global rank: the first whose wish set `scope` below kEveryOp
  uint64_t single_copy_min_bytes = 0;
};
constexpr size_t kVerdictBytes = 16;

Status writeVerdict(int fd, const HostVerdict& verdict, tcp::Deadline deadline) {
  std::string msg;
  common::ByteWriter w(&msg);
  w.u8(verdict.mapped);
  w.u8(static_cast<uint8_t>(verdict.scope));
  w.u8(static_cast<uint8_t>(verdict.limit_wish));
  w.u8(0);
  w.i32(verdict.limit_rank);
  w.u64(verdict.single_copy_min_bytes);
  return tcp::writeFull(fd, msg.data(), msg.size(), deadline);
}

Status readVerdict(int fd, tcp::Deadline deadline, HostVerdict* verdict) {
  uint8_t raw[kVerdictBytes];
  HVD_RETURN_IF_ERROR(tcp::readFull(fd, raw, sizeof(raw), deadline));
  common::ByteReader in(raw, sizeof(raw));
  uint8_t scope = 0, wish = 0, pad = 0;
  if (!in.u8(&verdict->mapped) || !in.u8(&scope) || !in.u8(&wish) || !in.u8(&pad) ||
      !in.i32(&verdict->limit_rank) || !in.u64(&verdict->single_copy_min_bytes)) {
    return common::internalError("malformed host collective verdict: " + in.error());
  }
  verdict->scope = static_cast<SingleCopyScope>(scope);
  verdict->limit_wish = static_cast<SingleCopyWish>(wish);
  // The scope is the limiting rank's wish's, or every op where no rank limits it.
  const bool limited = verdict->limit_rank >= 0;
  if (pad != 0 || scope > static_cast<uint8_t>(SingleCopyScope::kEveryOp) ||
      wish > kLastSingleCopyWish || verdict->limit_rank < -1 ||
      (limited ? scopeOf(verdict->limit_wish) != verdict->scope
               : verdict->scope != SingleCopyScope::kEveryOp)) {
    return common::internalError(
        "malformed host collective verdict: single-copy scope " + std::to_string(scope) +
        ", wish " + std::to_string(wish) + " of rank " + std::to_string(verdict->limit_rank));
  }
  return Status::ok();
}

// L: folds rank `rank`'s wish into the verdict (host order, L first).
void foldWish(int rank, SingleCopyWish wish, HostVerdict* verdict) {
  if (scopeOf(wish) < verdict->scope) {
    verdict->scope = scopeOf(wish);
    verdict->limit_wish = wish;
    verdict->limit_rank = rank;
  }
}

void recordWish(const HostVerdict& verdict, CollectiveSegment* segment) {
  const std::string who = "rank " + std::to_string(verdict.limit_rank);
  std::string reason;
  switch (verdict.limit_wish) {
    case SingleCopyWish::kOff:
      reason = who + " has HVD_SINGLE_COPY off (0; auto, the default, reads broadcasts "
                     "directly where it can, 1 every op)";
      break;
    case SingleCopyWish::kNotTwoThreads:
      reason = who + " would read a broadcast on one thread (HVD_SINGLE_COPY=auto, the "
                     "default, reads broadcasts directly only where every rank of the host "
                     "has two CPUs per reader, Note [Two-thread reads]; 1 reads anyway)";
      break;
    case SingleCopyWish::kBroadcast:
      reason = who + " has HVD_SINGLE_COPY=auto (the default): broadcasts only; 1 on every "
                     "rank reads allgather and alltoall directly too";
      break;
    case SingleCopyWish::kEveryOp: break;
  }
  segment->setSingleCopyWish(verdict.scope, reason, verdict.single_copy_min_bytes);
}

uint64_t chunkBytesFor(const CollectiveRequest& request) {
  const uint64_t piece = (std::max<uint64_t>(request.piece_bytes, 64) + 63) / 64 * 64;
  return piece * request.host_ranks.size();
}

// Steps F, H, I on the leader.
Status leadHost(const CollectiveRequest& request, std::unique_ptr<CollectiveSegment>* out) {
  const int n = static_cast<int>(request.host_ranks.size());
  Offer offer;
  offer.count = static_cast<uint32_t>(n);
  offer.depth = request.depth;
  offer.bytes = chunkBytesFor(request);
  std::unique_ptr<CollectiveSegment> segment;
  if (request.wanted) {
    offer.name = segmentName(request.job_id, 'c', request.rank);
    Status s = CollectiveSegment::create(offer.name, n, offer.depth, offer.bytes, &segment);
    if (!s.isOk()) {
      HVD_LOG(kWarning, "transport") << "no host collective segment, allreduce within the host "
                                     << "uses the pairs: " << s.message();
      offer.name.clear();
    }
  }
  offer.ok = segment != nullptr;
  if (segment) segment->boardHeader(0)->wish.store(request.one_round_bytes);
  for (int i = 1; i < n; ++i) {
    HVD_RETURN_IF_ERROR(writeOffer(request.fds[request.host_ranks[i]], kCollectiveOfferMagic,
                                   offer, request.deadline));
  }
  bool all = offer.ok;
  HostVerdict verdict;
  foldWish(request.rank, request.single_copy_wish, &verdict);
  verdict.single_copy_min_bytes = request.single_copy_min_bytes;
  for (int i = 1; i < n; ++i) {
    uint8_t ack[2] = {0, 0};  // mapped, its SingleCopyWish
    HVD_RETURN_IF_ERROR(tcp::readFull(request.fds[request.host_ranks[i]], ack, sizeof(ack),
                                      request.deadline));
    if (ack[1] > kLastSingleCopyWish) {
      return common::internalError("malformed host collective ack from rank " +
                                   std::to_string(request.host_ranks[i]) + ": single-copy wish " +
                                   std::to_string(ack[1]));
    }
    all = all && ack[0] == 1;
    foldWish(request.host_ranks[i], static_cast<SingleCopyWish>(ack[1]), &verdict);
  }
  verdict.mapped = all ? 1 : 0;
  for (int i = 1; i < n; ++i) {
    HVD_RETURN_IF_ERROR(writeVerdict(request.fds[request.host_ranks[i]], verdict,
                                     request.deadline));
  }
  if (segment) segment->unlink();
  if (all) {
    recordWish(verdict, segment.get());
    *out = std::move(segment);
  }
  return Status::ok();
}

// Step G and the end of H on every other rank of the host.
Status followLeader(const CollectiveRequest& request, std::unique_ptr<CollectiveSegment>* out) {
  const int fd = request.fds[request.host_ranks[0]];
  Offer offer;
  HVD_RETURN_IF_ERROR(readOffer(fd, kCollectiveOfferMagic, request.deadline, &offer));
  const int n = static_cast<int>(request.host_ranks.size());
  std::unique_ptr<CollectiveSegment> segment;
  if (request.wanted && offer.ok && offer.count == static_cast<uint32_t>(n) &&
      offer.depth == request.depth && offer.bytes == chunkBytesFor(request)) {
    Status s = CollectiveSegment::open(offer.name, n, offer.depth, offer.bytes, &segment);
    if (!s.isOk()) {
      HVD_LOG(kWarning, "transport") << "cannot map the host collective segment: "
                                     << s.message();
    }
  }
  if (segment) {
    const int local = static_cast<int>(std::find(request.host_ranks.begin(),
                                                 request.host_ranks.end(), request.rank) -
                                       request.host_ranks.begin());
    segment->boardHeader(local)->wish.store(request.one_round_bytes);
  }
  const uint8_t ack[2] = {static_cast<uint8_t>(segment ? 1 : 0),
                         static_cast<uint8_t>(request.single_copy_wish)};
  HVD_RETURN_IF_ERROR(tcp::writeFull(fd, ack, sizeof(ack), request.deadline));
  HostVerdict verdict;
  HVD_RETURN_IF_ERROR(readVerdict(fd, request.deadline, &verdict));
  if (verdict.mapped == 1 && segment) {
    recordWish(verdict, segment.get());
    *out = std::move(segment);
  }
  return Status::ok();
}

}  // namespace

uint64_t CollectiveSegment::totalBytes(int local_size, uint32_t depth, uint64_t chunk_bytes) {
  const uint64_t n = static_cast<uint64_t>(local_size);
  return kHeaderBytes + n * kControlBytes + n * depth * chunk_bytes + n * kBoardBytes;
}

Status CollectiveSegment::create(const std::string& name, int local_size, uint32_t depth,
                                 uint64_t chunk_bytes, std::unique_ptr<CollectiveSegment>* out) {
  const uint64_t total = totalBytes(local_size, depth, chunk_bytes);
  std::unique_ptr<CollectiveSegment> segment(new CollectiveSegment());
  HVD_RETURN_IF_ERROR(SharedMapping::create(name, total, &segment->mapping_));
  segment->local_size_ = local_size;
  segment->depth_ = depth;
  segment->chunk_bytes_ = chunk_bytes;
  // The file is zero-filled: every counter and doorbell starts at 0. Peers read the header
  // after receiving the name over a socket (a syscall, so ordered after these stores).
  auto* header = reinterpret_cast<Header*>(segment->base());
  header->magic = kCollectiveMagic;
  header->local_size = static_cast<uint32_t>(local_size);
  header->depth = depth;
  header->chunk_bytes = chunk_bytes;
  header->total_bytes = total;
  *out = std::move(segment);
  return Status::ok();
}

Status CollectiveSegment::open(const std::string& name, int local_size, uint32_t depth,
                               uint64_t chunk_bytes, std::unique_ptr<CollectiveSegment>* out) {
  const uint64_t total = totalBytes(local_size, depth, chunk_bytes);
  std::unique_ptr<CollectiveSegment> segment(new CollectiveSegment());
  HVD_RETURN_IF_ERROR(SharedMapping::open(name, total, &segment->mapping_));
  segment->local_size_ = local_size;
  segment->depth_ = depth;
  segment->chunk_bytes_ = chunk_bytes;
  const auto* header = reinterpret_cast<const Header*>(segment->base());
  if (header->magic != kCollectiveMagic ||
      header->local_size != static_cast<uint32_t>(local_size) || header->depth != depth ||
      header->chunk_bytes != chunk_bytes || header->total_bytes != total) {
    return common::internalError("shared memory " + name + " has a bad header");
  }
  *out = std::move(segment);
  return Status::ok();
}

uint8_t* CollectiveSegment::slot(int local, uint64_t chunk) const {
  const uint64_t index = static_cast<uint64_t>(local) * depth_ + chunk % depth_;
  return base() + kHeaderBytes + local_size_ * kControlBytes + index * chunk_bytes_;
}

std::atomic<uint64_t>& CollectiveSegment::counter(int local, Stage stage) const {
  auto* counters = reinterpret_cast<std::atomic<uint64_t>*>(base() + kHeaderBytes +
                                                            local * kControlBytes);
  return counters[static_cast<int>(stage)];
}

Doorbell* CollectiveSegment::doorbell(int local) const {
  return reinterpret_cast<Doorbell*>(base() + kHeaderBytes + local * kControlBytes + 64);
}

PeerRegion* CollectiveSegment::region(int local) const {
  return reinterpret_cast<PeerRegion*>(base() + kHeaderBytes + local * kControlBytes + 128);
}

BoardHeader* CollectiveSegment::boardHeader(int local) const {
  const uint64_t slots = static_cast<uint64_t>(local_size_) * depth_ * chunk_bytes_;
  return reinterpret_cast<BoardHeader*>(base() + kHeaderBytes + local_size_ * kControlBytes +
                                        slots + static_cast<uint64_t>(local) * kBoardBytes);
}

uint8_t* CollectiveSegment::boardSlot(int local, uint64_t round) const {
  return reinterpret_cast<uint8_t*>(boardHeader(local)) + 64 + (round % 2) * kBoardSlotBytes;
}

Status setupCollectiveSegment(const CollectiveRequest& request,
                              std::unique_ptr<CollectiveSegment>* out) {
  out->reset();
  const int n = static_cast<int>(request.host_ranks.size());
  if (n < 2) return Status::ok();
  if (n > kMaxLocalSize) return Status::ok();  // every rank of the host skips alike
  const Status s = request.host_ranks[0] == request.rank ? leadHost(request, out)
                                                        : followLeader(request, out);
  if (s.isOk() && *out) (*out)->setPeerPids(request.host_pids);
  return s;
}

}  // namespace hvd::transport::shm
