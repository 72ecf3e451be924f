// Shared-memory setup (transport/shm/setup.h).
//
// Note [Shm setup]
// Run by every rank with each peer P of its host, over the authenticated data socket to P:
//   A. If shm is wanted, the rank creates one segment, segmentName(job, 'r', rank), with one
//      ring per local peer (ring k receives from local_peers[k]). If creation fails (e.g. a
//      full /dev/shm) it logs a warning and offers nothing.
//   B. It writes an Offer (transport/shm/offer.h, magic 'HVDS') to every P: ok, the ring
//      index for P, the ring count, the ring bytes and the name. All offers are written
//      before any is read; each is < 300 bytes, so the socket buffers absorb them.
//   C. It reads P's offer, validates it, and maps P's segment if both offered. It writes an
//      Ack byte to P: 1 = mapped, 0 = not.
//   D. It reads P's ack. The pair uses shm iff both acks are 1; both sides compute the same
//      answer from the same two bytes, so they always agree (else tcp).
//   E. Every peer has now mapped the segment or declined it, so the rank unlinks its name: from
//      here a crash of any rank leaks no shared memory (the kernel frees it with the last
//      mapping). Only a crash between A and E can leave a name in /dev/shm.
#include "transport/shm/setup.h"

#include "common/logging.h"
#include "transport/shm/offer.h"

namespace hvd::transport::shm {

using common::Status;

namespace {

constexpr uint32_t kMaxRings = 4096;
constexpr uint64_t kMaxRingBytes = 1ull << 32;

// Step C's validation: the shape of a pair segment a peer offers.
Status checkPairOffer(const Offer& offer) {
  const bool sane = offer.count > 0 && offer.count <= kMaxRings && offer.index < offer.count &&
                    offer.bytes >= 64 && offer.bytes <= kMaxRingBytes;
  if (offer.ok && !sane) return common::internalError("malformed shm offer");
  return Status::ok();
}

// Step A.
std::unique_ptr<Segment> createOwn(const SetupRequest& request) {
  if (!request.wanted || request.local_peers.empty()) return nullptr;
  std::unique_ptr<Segment> own;
  const std::string name = segmentName(request.job_id, 'r', request.rank);
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
      offer.index = static_cast<uint32_t>(k);
      offer.count = result->own->ringCount();
      offer.bytes = result->own->ringBytes();
      offer.name = result->own->name();
    }
    result->incoming_ring[peers[k]] = static_cast<uint32_t>(k);
    HVD_RETURN_IF_ERROR(writeOffer(request.fds[peers[k]], kPairOfferMagic, offer,
                                   request.deadline));
  }
  std::vector<uint8_t> mapped(world, 0);
  for (int p : peers) {  // step C
    Offer offer;
    HVD_RETURN_IF_ERROR(readOffer(request.fds[p], kPairOfferMagic, request.deadline, &offer));
    HVD_RETURN_IF_ERROR(checkPairOffer(offer));
    if (result->own && offer.ok) {
      Status s = Segment::open(offer.name, offer.count, offer.bytes, &result->peer_segment[p]);
      if (s.isOk()) {
        mapped[p] = 1;
        result->outgoing_ring[p] = offer.index;
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
