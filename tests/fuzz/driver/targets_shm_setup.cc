// The shared-memory setup decoders of a peer's bytes, each run through its public entry point
// on a socket fed with the input (FedSocket), with shared memory not wanted, so nothing is
// mapped: the pair's offer and ack (shm/offer.h through shm/setup.h), the host collective
// setup from both ends (shm/collective_segment.h: the leader's offer and verdict, a
// follower's ack and single-copy wish) and the host probes' verdict (shm/host_agreement.h).
#include <memory>
#include <string>
#include <vector>

#include "common/byte_codec.h"
#include "fuzz.h"
#include "status_outcome.h"
#include "transport/shm/collective_segment.h"
#include "transport/shm/host_agreement.h"
#include "transport/shm/offer.h"
#include "transport/shm/setup.h"

namespace hvd::fuzz {
namespace {

using common::Status;
namespace shm = transport::shm;

std::string offerBytes(Rng& rng, uint32_t magic) {
  shm::Offer offer;
  offer.ok = !rng.chance(4);
  if (offer.ok) {
    // segmentName's form, with the nonce from rng: the same seeds on every run.
    offer.name = "/hvd-job-7-r0-" + std::to_string(rng.next());
    offer.count = static_cast<uint32_t>(1 + rng.below(4));
    offer.index = static_cast<uint32_t>(rng.below(offer.count));
    offer.depth = static_cast<uint32_t>(rng.below(8));
    offer.bytes = 64 << rng.below(16);
  }
  FedSocket out;  // the encoder writes to a socket: its bytes are taken from the other end
  shm::writeOffer(out.fd(), magic, offer, soon());
  return out.written();
}

// Pair setup (Note [Shm setup]) as rank 0 with one local peer, rank 1: the input is rank 1's
// offer and its ack.
Outcome pairOffer(const std::string& input) {
  FedSocket sock(input);
  shm::SetupRequest request;
  request.rank = 0;
  request.job_id = "job-7";
  request.local_peers = {1};
  request.fds = {-1, sock.fd()};
  request.wanted = false;
  request.deadline = soon();
  shm::SetupResult result;
  const Status s = shm::setupSharedMemory(request, &result);
  if (s.isOk()) return result.peer_segment[1] ? failed("mapped although not wanted") : accepted();
  return refused(s);
}

// Host collective setup (Note [Collective setup]) between leader 0 and rank 1, as `rank`: as
// rank 1 the input is the leader's offer and its verdict, as rank 0 rank 1's ack (mapped, its
// SingleCopyWish), the leader sending its offer and the host's verdict.
Outcome collectiveSetup(const std::string& input, int rank) {
  FedSocket sock(input);
  shm::CollectiveRequest request;
  request.rank = rank;
  request.job_id = "job-7";
  request.host_ranks = {0, 1};
  request.fds = rank == 0 ? std::vector<int>{-1, sock.fd()} : std::vector<int>{sock.fd(), -1};
  request.wanted = false;
  request.single_copy_wish = shm::SingleCopyWish::kEveryOp;
  request.deadline = soon();
  std::unique_ptr<shm::CollectiveSegment> segment;
  const Status s = shm::setupCollectiveSegment(request, &segment);
  if (!s.isOk()) return refused(s);
  if (segment) return failed("mapped although not wanted");
  const std::string out = sock.written();  // as leader: its offer, then the verdict (16 bytes)
  const auto theirs = shm::scopeOf(static_cast<shm::SingleCopyWish>(input[1]));
  if (rank == 0 && (out.size() < 16 || out[out.size() - 15] != static_cast<char>(theirs))) {
    return failed("the verdict's scope is not the least any rank wished");
  }
  return accepted();
}

std::vector<std::string> offerSeeds(Rng& rng, uint32_t magic, size_t trailer) {
  std::vector<std::string> seeds;
  for (int i = 0; i < 16; ++i) {
    std::string trail = rng.bytes(trailer);
    if (trailer == 1) trail[0] = static_cast<char>(rng.below(2));  // the ack
    if (trailer == 16) {  // step H's verdict: mapped, the scope of the limiting rank's wish
      const auto wish = static_cast<shm::SingleCopyWish>(rng.below(4));
      const bool limited = shm::scopeOf(wish) != shm::SingleCopyScope::kEveryOp;
      trail.clear();
      common::ByteWriter w(&trail);
      w.u8(static_cast<uint8_t>(rng.below(2)));
      w.u8(static_cast<uint8_t>(shm::scopeOf(wish)));
      w.u8(static_cast<uint8_t>(wish));
      w.u8(0);
      w.i32(limited ? 1 : -1);
      w.u64(rng.next());
    }
    seeds.push_back(offerBytes(rng, magic) + trail);
  }
  return seeds;
}

std::vector<std::string> ackSeeds(Rng& rng) {  // mapped, a SingleCopyWish
  return {{static_cast<char>(rng.below(2)), static_cast<char>(rng.below(4))}, {1, 2}, {1, 3}};
}

// Both ends of agreeOnVerdict: the leader reads a follower's verdict and sends the host's
// back (which must be the one it read, ours being fine); a follower reads the host's.
Outcome probeVerdict(const std::string& input) {
  const shm::ProbeVerdict fine;
  shm::ProbeVerdict host;
  FedSocket leader(input);
  const Status s = shm::agreeOnVerdict({0, 1}, {-1, leader.fd()}, 0, fine, &host, soon());
  FedSocket follower(input);
  shm::ProbeVerdict told;
  const Status t = shm::agreeOnVerdict({0, 1}, {follower.fd(), -1}, 1, fine, &told, soon());
  for (const Status* x : {&s, &t}) {
    if (!x->isOk() && refused(*x).verdict == Verdict::kFailed) return refused(*x);
  }
  if (s.isOk() != t.isOk()) return failed("the two ends disagree on the same bytes");
  if (!s.isOk()) return rejected();
  if (host.refusal == 0) return told.refusal == 0 ? accepted() : failed("a refusal was lost");
  const std::string relayed = leader.written();
  if (relayed.compare(0, 12, input, 0, 12) != 0) return failed("the refusal was relayed altered");
  return told.refusal == host.refusal && told.rank == host.rank && told.peer == host.peer
             ? accepted() : failed("the ends read different refusals");
}

std::vector<std::string> verdictSeeds(Rng& rng) {
  std::vector<std::string> seeds;
  for (int i = 0; i < 8; ++i) {
    std::string s;
    common::ByteWriter w(&s);
    w.u32(static_cast<uint32_t>(rng.below(5)));
    w.i32(static_cast<int32_t>(rng.below(4)));
    w.i32(static_cast<int32_t>(rng.below(4)) - 1);
    w.u32(0);
    seeds.push_back(s);
  }
  return seeds;
}

}  // namespace

void addShmSetupTargets(std::vector<Target>* out) {
  using transport::shm::kCollectiveOfferMagic;
  using transport::shm::kPairOfferMagic;
  out->push_back({"shm_pair_offer", "shm::readOffer + checkPairOffer via setupSharedMemory",
                  [](Rng& rng) { return offerSeeds(rng, kPairOfferMagic, 1); }, pairOffer});
  out->push_back({"shm_collective_offer", "shm::readOffer + host verdict, setupCollectiveSegment",
                  [](Rng& rng) { return offerSeeds(rng, kCollectiveOfferMagic, 16); },
                  [](const std::string& input) { return collectiveSetup(input, 1); }});
  out->push_back({"shm_collective_ack", "a follower's ack, as setupCollectiveSegment's leader",
                  ackSeeds, [](const std::string& input) { return collectiveSetup(input, 0); }});
  out->push_back({"probe_verdict", "shm::agreeOnVerdict, leader and follower", verdictSeeds,
                  probeVerdict});
}

}  // namespace hvd::fuzz
