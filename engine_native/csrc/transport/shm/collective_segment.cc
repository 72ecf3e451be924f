// Host collective segment (transport/shm/collective_segment.h).
//
// Layout: [header 64 B][per local rank: 3 lines = counters, doorbell, padding][slots of rank 0:
// depth x chunk_bytes][slots of rank 1]... Counters and doorbell sit on their own cache lines:
// counters are written by their owner only, the doorbell by everyone; slots start on 64-byte
// boundaries (chunk_bytes is a multiple of 64).
//
// Note [Collective setup]
// Run by every rank of a host after the pair setup (Note [Shm setup]), over the authenticated
// data sockets, between the host's leader L (its lowest rank) and each other rank P:
//   F. L creates "/hvd-<job>-c<L>-<nonce>" sized for the host (if shm is wanted and creation
//      succeeds) and writes an offer to every P: u32 magic 'HVDC', u8 ok, u8 name length,
//      u16 local size, u32 depth, u32 0, u64 chunk bytes, name.
//   G. P reads the offer; if both it and P want shm and the fields match what P computes
//      itself, P maps the segment. P writes an ack byte to L: 1 = mapped, 0 = not.
//   H. L reads every ack and writes one verdict byte to every P: 1 iff its own offer was ok
//      and every ack was 1. P keeps its mapping iff the verdict is 1. So the whole host agrees:
//      an op uses the segment on all of the host's ranks or on none (Note [Host pipeline]).
//   I. L unlinks the name: every rank has mapped it or given up, so no crash can leak it.
// Offers and verdicts are a few dozen bytes, so the socket buffers absorb all of L's writes.
#include "transport/shm/collective_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/hmac.h"
#include "common/logging.h"

namespace hvd::transport::shm {

using common::Status;

namespace {

constexpr uint64_t kCollectiveMagic = 0x31304c4f43445648ull;  // "HVDCOL01"
constexpr uint32_t kOfferMagic = 0x43445648;                  // "HVDC"
constexpr size_t kOfferFixedBytes = 24;
constexpr size_t kHeaderBytes = 64;
constexpr size_t kControlBytes = 3 * 64;  // per rank: counters, doorbell, padding
constexpr int kMaxLocalSize = 1024;

struct Header {
  uint64_t magic;
  uint32_t local_size;
  uint32_t depth;
  uint64_t chunk_bytes;
  uint64_t total_bytes;
};
static_assert(sizeof(Header) <= kHeaderBytes, "header must fit its slot");
static_assert(sizeof(std::atomic<uint64_t>) * kStageCount <= 64, "counters share one line");

struct Offer {
  bool ok = false;
  int local_size = 0;
  uint32_t depth = 0;
  uint64_t chunk_bytes = 0;
  std::string name;
};

void putLe(uint8_t* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t getLe(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

std::string collectiveName(const std::string& job_id, int rank) {
  std::string name = "/hvd-";
  for (char c : job_id.substr(0, 24)) {
    const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                      (c >= '0' && c <= '9') || c == '-' || c == '_';
    name += keep ? c : '_';
  }
  uint8_t nonce[8];
  common::randomBytes(nonce, sizeof(nonce));
  return name + "-c" + std::to_string(rank) + "-" + common::toHex(nonce, sizeof(nonce));
}

Status writeOffer(int fd, const Offer& offer, tcp::Deadline deadline) {
  uint8_t msg[kOfferFixedBytes + 255] = {};
  putLe(msg, kOfferMagic, 4);
  msg[4] = offer.ok ? 1 : 0;
  msg[5] = static_cast<uint8_t>(offer.name.size());
  putLe(msg + 6, static_cast<uint64_t>(offer.local_size), 2);
  putLe(msg + 8, offer.depth, 4);
  putLe(msg + 16, offer.chunk_bytes, 8);
  std::memcpy(msg + kOfferFixedBytes, offer.name.data(), offer.name.size());
  return tcp::writeFull(fd, msg, kOfferFixedBytes + offer.name.size(), deadline);
}

Status readOffer(int fd, tcp::Deadline deadline, Offer* offer) {
  uint8_t fixed[kOfferFixedBytes];
  HVD_RETURN_IF_ERROR(tcp::readFull(fd, fixed, sizeof(fixed), deadline));
  if (getLe(fixed, 4) != kOfferMagic) return common::internalError("bad collective offer");
  offer->ok = fixed[4] == 1;
  offer->local_size = static_cast<int>(getLe(fixed + 6, 2));
  offer->depth = static_cast<uint32_t>(getLe(fixed + 8, 4));
  offer->chunk_bytes = getLe(fixed + 16, 8);
  offer->name.resize(fixed[5]);
  if (!offer->name.empty()) {
    HVD_RETURN_IF_ERROR(tcp::readFull(fd, &offer->name[0], offer->name.size(), deadline));
  }
  const bool sane = offer->name.rfind("/hvd-", 0) == 0 &&
                    offer->name.find('/', 1) == std::string::npos;
  if (offer->ok && !sane) return common::internalError("malformed collective offer");
  return Status::ok();
}

uint64_t chunkBytesFor(const CollectiveRequest& request) {
  const uint64_t piece = (std::max<uint64_t>(request.piece_bytes, 64) + 63) / 64 * 64;
  return piece * request.host_ranks.size();
}

// Steps F, H, I on the leader.
Status leadHost(const CollectiveRequest& request, std::unique_ptr<CollectiveSegment>* out) {
  const int n = static_cast<int>(request.host_ranks.size());
  Offer offer;
  offer.local_size = n;
  offer.depth = request.depth;
  offer.chunk_bytes = chunkBytesFor(request);
  std::unique_ptr<CollectiveSegment> segment;
  if (request.wanted) {
    offer.name = collectiveName(request.job_id, request.rank);
    Status s = CollectiveSegment::create(offer.name, n, offer.depth, offer.chunk_bytes, &segment);
    if (!s.isOk()) {
      HVD_LOG(kWarning, "transport") << "no host collective segment, allreduce within the host "
                                     << "uses the pairs: " << s.message();
      offer.name.clear();
    }
  }
  offer.ok = segment != nullptr;
  for (int i = 1; i < n; ++i) {
    HVD_RETURN_IF_ERROR(writeOffer(request.fds[request.host_ranks[i]], offer, request.deadline));
  }
  bool all = offer.ok;
  for (int i = 1; i < n; ++i) {
    uint8_t ack = 0;
    HVD_RETURN_IF_ERROR(tcp::readFull(request.fds[request.host_ranks[i]], &ack, 1,
                                      request.deadline));
    all = all && ack == 1;
  }
  const uint8_t verdict = all ? 1 : 0;
  for (int i = 1; i < n; ++i) {
    HVD_RETURN_IF_ERROR(tcp::writeFull(request.fds[request.host_ranks[i]], &verdict, 1,
                                       request.deadline));
  }
  if (segment) segment->unlink();
  if (all) *out = std::move(segment);
  return Status::ok();
}

// Step G and the end of H on every other rank of the host.
Status followLeader(const CollectiveRequest& request, std::unique_ptr<CollectiveSegment>* out) {
  const int fd = request.fds[request.host_ranks[0]];
  Offer offer;
  HVD_RETURN_IF_ERROR(readOffer(fd, request.deadline, &offer));
  const int n = static_cast<int>(request.host_ranks.size());
  std::unique_ptr<CollectiveSegment> segment;
  if (request.wanted && offer.ok && offer.local_size == n && offer.depth == request.depth &&
      offer.chunk_bytes == chunkBytesFor(request)) {
    Status s = CollectiveSegment::open(offer.name, n, offer.depth, offer.chunk_bytes, &segment);
    if (!s.isOk()) {
      HVD_LOG(kWarning, "transport") << "cannot map the host collective segment: "
                                     << s.message();
    }
  }
  const uint8_t ack = segment ? 1 : 0;
  HVD_RETURN_IF_ERROR(tcp::writeFull(fd, &ack, 1, request.deadline));
  uint8_t verdict = 0;
  HVD_RETURN_IF_ERROR(tcp::readFull(fd, &verdict, 1, request.deadline));
  if (verdict == 1 && segment) *out = std::move(segment);
  return Status::ok();
}

}  // namespace

uint64_t CollectiveSegment::totalBytes(int local_size, uint32_t depth, uint64_t chunk_bytes) {
  const uint64_t n = static_cast<uint64_t>(local_size);
  return kHeaderBytes + n * kControlBytes + n * depth * chunk_bytes;
}

Status CollectiveSegment::create(const std::string& name, int local_size, uint32_t depth,
                                 uint64_t chunk_bytes, std::unique_ptr<CollectiveSegment>* out) {
  std::unique_ptr<CollectiveSegment> segment(new CollectiveSegment());
  segment->name_ = name;
  segment->local_size_ = local_size;
  segment->depth_ = depth;
  segment->chunk_bytes_ = chunk_bytes;
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return common::internalError("shm_open(" + name + "): " + std::strerror(errno));
  segment->linked_ = true;
  HVD_RETURN_IF_ERROR(segment->map(fd, true));
  // The file is zero-filled: every counter and doorbell starts at 0. Peers read the header
  // after receiving the name over a socket (a syscall, so ordered after these stores).
  auto* header = reinterpret_cast<Header*>(segment->base_);
  header->magic = kCollectiveMagic;
  header->local_size = static_cast<uint32_t>(local_size);
  header->depth = depth;
  header->chunk_bytes = chunk_bytes;
  header->total_bytes = segment->bytes_;
  *out = std::move(segment);
  return Status::ok();
}

Status CollectiveSegment::open(const std::string& name, int local_size, uint32_t depth,
                               uint64_t chunk_bytes, std::unique_ptr<CollectiveSegment>* out) {
  std::unique_ptr<CollectiveSegment> segment(new CollectiveSegment());
  segment->name_ = name;
  segment->local_size_ = local_size;
  segment->depth_ = depth;
  segment->chunk_bytes_ = chunk_bytes;
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return common::internalError("shm_open(" + name + "): " + std::strerror(errno));
  HVD_RETURN_IF_ERROR(segment->map(fd, false));
  const auto* header = reinterpret_cast<const Header*>(segment->base_);
  if (header->magic != kCollectiveMagic ||
      header->local_size != static_cast<uint32_t>(local_size) || header->depth != depth ||
      header->chunk_bytes != chunk_bytes || header->total_bytes != segment->bytes_) {
    return common::internalError("shared memory " + name + " has a bad header");
  }
  *out = std::move(segment);
  return Status::ok();
}

// Sizes (creator) or checks the size (others), maps, and closes fd.
Status CollectiveSegment::map(int fd, bool created) {
  const uint64_t total = totalBytes(local_size_, depth_, chunk_bytes_);
  int err = 0;
  if (created) {
    err = ::ftruncate(fd, static_cast<off_t>(total)) == 0 ? 0 : errno;
    if (err == 0) err = ::posix_fallocate(fd, 0, static_cast<off_t>(total));
  } else {
    struct stat st {};
    if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != total) err = EINVAL;
  }
  void* base = MAP_FAILED;
  if (err == 0) {
    base = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) err = errno;
  }
  ::close(fd);
  if (err != 0) {
    return common::internalError("cannot map " + std::to_string(total) +
                                 " bytes of shared memory for " + name_ + ": " +
                                 std::strerror(err));
  }
  base_ = static_cast<uint8_t*>(base);
  bytes_ = total;
  return Status::ok();
}

CollectiveSegment::~CollectiveSegment() {
  unlink();
  if (base_ != nullptr) ::munmap(base_, bytes_);
}

void CollectiveSegment::unlink() {
  if (linked_) ::shm_unlink(name_.c_str());
  linked_ = false;
}

uint8_t* CollectiveSegment::slot(int local, uint64_t chunk) const {
  const uint64_t index = static_cast<uint64_t>(local) * depth_ + chunk % depth_;
  return base_ + kHeaderBytes + local_size_ * kControlBytes + index * chunk_bytes_;
}

std::atomic<uint64_t>& CollectiveSegment::counter(int local, Stage stage) const {
  auto* counters = reinterpret_cast<std::atomic<uint64_t>*>(base_ + kHeaderBytes +
                                                            local * kControlBytes);
  return counters[static_cast<int>(stage)];
}

Doorbell* CollectiveSegment::doorbell(int local) const {
  return reinterpret_cast<Doorbell*>(base_ + kHeaderBytes + local * kControlBytes + 64);
}

Status setupCollectiveSegment(const CollectiveRequest& request,
                              std::unique_ptr<CollectiveSegment>* out) {
  out->reset();
  const int n = static_cast<int>(request.host_ranks.size());
  if (n < 2) return Status::ok();
  if (n > kMaxLocalSize) return Status::ok();  // every rank of the host skips alike
  return request.host_ranks[0] == request.rank ? leadHost(request, out)
                                               : followLeader(request, out);
}

}  // namespace hvd::transport::shm
