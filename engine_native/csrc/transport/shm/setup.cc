// Shared-memory setup (transport/shm/setup.h).
//
// Note [Shm setup]
// Run by every rank with each peer P of its host, over the authenticated data socket to P:
//   A. If shm is wanted, the rank creates one segment, "/hvd-<job>-r<rank>-<nonce>", with one
//      ring per local peer (ring k receives from local_peers[k]). If creation fails (e.g. a
//      full /dev/shm) it logs a warning and offers nothing.
//   B. It writes an Offer to every P: u32 magic 'HVDS', u8 ok, u8 name length, u16 0,
//      u32 ring index for P, u32 ring count, u64 ring bytes, name. All offers are written
//      before any is read; each is < 300 bytes, so the socket buffers absorb them.
//   C. It reads P's offer, validates it, and maps P's segment if both offered. It writes an
//      Ack byte to P: 1 = mapped, 0 = not.
//   D. It reads P's ack. The pair uses shm iff both acks are 1; both sides compute the same
//      answer from the same two bytes, so they always agree (else tcp).
//   E. Every peer has now mapped the segment or declined it, so the rank unlinks its name: from
//      here a crash of any rank leaks no shared memory (the kernel frees it with the last
//      mapping). Only a crash between A and E can leave a name in /dev/shm.
#include "transport/shm/setup.h"

#include <cstring>

#include "common/hmac.h"
#include "common/logging.h"

namespace hvd::transport::shm {

using common::Status;

namespace {

constexpr uint32_t kOfferMagic = 0x53445648;  // "HVDS"
constexpr size_t kOfferFixedBytes = 24;
constexpr uint32_t kMaxRings = 4096;
constexpr uint64_t kMaxRingBytes = 1ull << 32;

struct Offer {
  bool ok = false;
  uint32_t ring_index = 0;
  uint32_t ring_count = 0;
  uint64_t ring_bytes = 0;
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

std::string segmentName(const std::string& job_id, int rank) {
  std::string name = "/hvd-";
  for (char c : job_id.substr(0, 24)) {
    const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                      (c >= '0' && c <= '9') || c == '-' || c == '_';
    name += keep ? c : '_';
  }
  uint8_t nonce[8];
  common::randomBytes(nonce, sizeof(nonce));
  return name + "-r" + std::to_string(rank) + "-" + common::toHex(nonce, sizeof(nonce));
}

Status writeOffer(int fd, const Offer& offer, tcp::Deadline deadline) {
  uint8_t msg[kOfferFixedBytes + 255] = {};
  putLe(msg, kOfferMagic, 4);
  msg[4] = offer.ok ? 1 : 0;
  msg[5] = static_cast<uint8_t>(offer.name.size());
  putLe(msg + 8, offer.ring_index, 4);
  putLe(msg + 12, offer.ring_count, 4);
  putLe(msg + 16, offer.ring_bytes, 8);
  std::memcpy(msg + kOfferFixedBytes, offer.name.data(), offer.name.size());
  return tcp::writeFull(fd, msg, kOfferFixedBytes + offer.name.size(), deadline);
}

Status readOffer(int fd, tcp::Deadline deadline, Offer* offer) {
  uint8_t fixed[kOfferFixedBytes];
  HVD_RETURN_IF_ERROR(tcp::readFull(fd, fixed, sizeof(fixed), deadline));
  if (getLe(fixed, 4) != kOfferMagic) return common::internalError("bad shm offer");
  offer->ok = fixed[4] == 1;
  offer->ring_index = static_cast<uint32_t>(getLe(fixed + 8, 4));
  offer->ring_count = static_cast<uint32_t>(getLe(fixed + 12, 4));
  offer->ring_bytes = getLe(fixed + 16, 8);
  offer->name.resize(fixed[5]);
  if (!offer->name.empty()) {
    HVD_RETURN_IF_ERROR(tcp::readFull(fd, &offer->name[0], offer->name.size(), deadline));
  }
  const bool sane = offer->ring_count > 0 && offer->ring_count <= kMaxRings &&
                    offer->ring_index < offer->ring_count && offer->ring_bytes >= 64 &&
                    offer->ring_bytes <= kMaxRingBytes && offer->name.rfind("/hvd-", 0) == 0 &&
                    offer->name.find('/', 1) == std::string::npos;
  if (offer->ok && !sane) return common::internalError("malformed shm offer");
  return Status::ok();
}

// Step A.
std::unique_ptr<Segment> createOwn(const SetupRequest& request) {
  if (!request.wanted || request.local_peers.empty()) return nullptr;
  std::unique_ptr<Segment> own;
  const std::string name = segmentName(request.job_id, request.rank);
  Status s = Segment::create(name, static_cast<uint32_t>(request.local_peers.size()),
                             request.ring_bytes, &own);
  if (!s.isOk()) {
    HVD_LOG(kWarning, "transport") << "shared memory unavailable, using tcp within the host: "
                                   << s.message();
    return nullptr;
  }
  return own;
}

}  // namespace

Status setupSharedMemory(const SetupRequest& request, SetupResult* result) {
  const size_t world = request.fds.size();
  const std::vector<int>& peers = request.local_peers;
  result->peer_segment.clear();
  result->peer_segment.resize(world);
  result->incoming_ring.assign(world, 0);
  result->outgoing_ring.assign(world, 0);
  result->own = createOwn(request);
  if (peers.empty()) return Status::ok();

  for (size_t k = 0; k < peers.size(); ++k) {  // step B
    Offer offer;
    if (result->own) {
      offer.ok = true;
      offer.ring_index = static_cast<uint32_t>(k);
      offer.ring_count = result->own->ringCount();
      offer.ring_bytes = result->own->ringBytes();
      offer.name = result->own->name();
    }
    result->incoming_ring[peers[k]] = static_cast<uint32_t>(k);
    HVD_RETURN_IF_ERROR(writeOffer(request.fds[peers[k]], offer, request.deadline));
  }
  std::vector<uint8_t> mapped(world, 0);
  for (int p : peers) {  // step C
    Offer offer;
    HVD_RETURN_IF_ERROR(readOffer(request.fds[p], request.deadline, &offer));
    if (result->own && offer.ok) {
      Status s = Segment::open(offer.name, offer.ring_count, offer.ring_bytes,
                               &result->peer_segment[p]);
      if (s.isOk()) {
        mapped[p] = 1;
        result->outgoing_ring[p] = offer.ring_index;
      } else {
        HVD_LOG(kWarning, "transport") << "cannot map rank " << p << "'s shared memory, using "
                                       << "tcp to it: " << s.message();
      }
    }
    HVD_RETURN_IF_ERROR(tcp::writeFull(request.fds[p], &mapped[p], 1, request.deadline));
  }
  bool any = false;
  for (int p : peers) {  // step D
    uint8_t ack = 0;
    HVD_RETURN_IF_ERROR(tcp::readFull(request.fds[p], &ack, 1, request.deadline));
    if (ack != 1 || mapped[p] != 1) {
      result->peer_segment[p].reset();
    } else {
      any = true;
    }
  }
  if (result->own) result->own->unlink();  // step E
  if (!any) result->own.reset();
  return Status::ok();
}

}  // namespace hvd::transport::shm
