// Comm (transport/comm.h): the process-set view of the mesh and exchange(), the one place the
// background thread waits for the data plane.
//
// Note [Exchange progress]
//   A. Try every active transfer: move what each pair takes now. Transfers to one peer in one
//      direction form a byte stream, so only the first unfinished one of each (peer, direction)
//      is active; the others wait their turn (array order = stream order on both ranks).
//   B. All done: return. Any byte moved: go to A.
//   C. Nothing moved: abort -> kAborted; a peer socket hung up -> kPeerLost naming it (checked
//      at most every 20 ms, and only after one more try, so bytes a peer sent just before it
//      exited are never lost); no byte moved for timeout_seconds -> kTimeout naming the peer
//      and the transport.
//   D. Spin for at most HVD_SPIN_US with a pause instruction, retrying A.
//   E. Still nothing: block for one slice of <= 50 ms — poll() on the sockets of pending TCP
//      transfers plus the mesh's abort eventfd, or FUTEX_WAIT on this rank's doorbell for
//      pending shm transfers (Note [Doorbell ordering]); with both kinds pending, poll() the
//      TCP sockets and the shm pairs' sockets, on which shm peers send a wake byte instead of a
//      futex wake. Abort wakes all three at once. Then go to A.
// A rank idle in E costs about 20 wake-ups a second (one per slice), i.e. ~0% CPU.
#include "common/cpu_relax.h"
#include "transport/comm.h"

#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "common/check.h"
#include "common/logging.h"
#include "common/text.h"
#include "transport/mesh.h"
#include "transport/shm/pair.h"
#include "transport/tcp/pair.h"

namespace hvd::transport {

using common::Status;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kSliceMilliseconds = 50;
constexpr auto kLivenessInterval = std::chrono::milliseconds(20);
constexpr int kBurst = 16;  // sendSome/recvSome calls per transfer per pass

// The state of one exchange() call (Note [Exchange progress]).
class Exchange {
 public:
  Exchange(Mesh& mesh, const std::vector<int>& members, int self, Transfer* transfers,
           size_t count)
      : mesh_(mesh), members_(members), self_(self), transfers_(transfers), count_(count),
        pairs_(count, nullptr), active_(count, 0), busy_(2 * members.size(), 0) {}

  Status start();
  Status tryAll(bool* progressed);
  bool allDone() const { return remaining_ == 0; }
  bool shmReady() const;  // seq_cst re-check for the doorbell wait
  void waitSlice();
  // The first active unfinished transfer: whom we are waiting for.
  size_t firstPending() const;
  Status lostPeer(int global_rank) const;
  Pair* pairOf(size_t i) const { return pairs_[i]; }

 private:
  void markActive();
  void waitMixed(std::vector<pollfd>* fds, const std::vector<pollfd>& wake_fds,
                 shm::Doorbell* bell, int slice_ms);

  Mesh& mesh_;
  const std::vector<int>& members_;
  int self_;
  Transfer* transfers_;
  size_t count_;
  std::vector<Pair*> pairs_;
  std::vector<uint8_t> active_;
  std::vector<uint8_t> busy_;  // per (peer, direction): an earlier transfer is unfinished
  size_t remaining_ = 0;
};

// Validates the transfers, satisfies transfers to self by copying (k-th send to self feeds the
// k-th receive from self), and finds every other transfer's pair.
Status Exchange::start() {
  std::vector<size_t> self_sends, self_recvs;
  for (size_t i = 0; i < count_; ++i) {
    Transfer& t = transfers_[i];
    if (t.peer < 0 || t.peer >= static_cast<int>(members_.size())) {
      return common::internalError("exchange: peer " + std::to_string(t.peer) +
                                   " outside a set of " + std::to_string(members_.size()));
    }
    if (t.done >= t.bytes) continue;
    if (t.data == nullptr) return common::internalError("exchange: null buffer");
    if (t.peer == self_) {
      (t.is_send ? self_sends : self_recvs).push_back(i);
      continue;
    }
    pairs_[i] = mesh_.pair(members_[t.peer]);
    if (pairs_[i] == nullptr) {
      return common::internalError("exchange: no connection to rank " +
                                   std::to_string(members_[t.peer]));
    }
    ++remaining_;
  }
  if (self_sends.size() != self_recvs.size()) {
    return common::internalError("exchange: unmatched transfer to self");
  }
  for (size_t k = 0; k < self_sends.size(); ++k) {
    Transfer& s = transfers_[self_sends[k]];
    Transfer& r = transfers_[self_recvs[k]];
    if (s.bytes - s.done != r.bytes - r.done) {
      return common::internalError("exchange: transfer to self of mismatched sizes");
    }
    std::memmove(static_cast<uint8_t*>(r.data) + r.done,
                 static_cast<const uint8_t*>(s.data) + s.done, s.bytes - s.done);
    s.done = s.bytes;
    r.done = r.bytes;
  }
  return Status::ok();
}

void Exchange::markActive() {
  std::fill(busy_.begin(), busy_.end(), 0);
  for (size_t i = 0; i < count_; ++i) {
    const Transfer& t = transfers_[i];
    active_[i] = 0;
    if (pairs_[i] == nullptr || t.done >= t.bytes) continue;
    uint8_t& slot = busy_[2 * t.peer + (t.is_send ? 1 : 0)];
    active_[i] = slot == 0;
    slot = 1;
  }
}

Status Exchange::tryAll(bool* progressed) {
  *progressed = false;
  markActive();
  for (size_t i = 0; i < count_; ++i) {
    if (!active_[i]) continue;
    Transfer& t = transfers_[i];
    for (int k = 0; k < kBurst && t.done < t.bytes; ++k) {
      size_t moved = 0;
      uint8_t* at = static_cast<uint8_t*>(t.data) + t.done;
      Status s = t.is_send ? pairs_[i]->sendSome(at, t.bytes - t.done, &moved)
                           : pairs_[i]->recvSome(at, t.bytes - t.done, &moved);
      if (!s.isOk()) {
        HVD_LOG(kDebug, "transport") << "rank " << members_[t.peer] << ": " << s.message();
        return lostPeer(members_[t.peer]);
      }
      if (moved == 0) break;
      t.done += moved;
      *progressed = true;
    }
    if (t.done >= t.bytes) --remaining_;
  }
  return Status::ok();
}

bool Exchange::shmReady() const {
  for (size_t i = 0; i < count_; ++i) {
    if (!active_[i] || pairs_[i]->kind() != PairKind::kShm) continue;
    const auto* pair = static_cast<const shm::ShmPair*>(pairs_[i]);
    if (transfers_[i].is_send ? pair->canSend() : pair->canRecv()) return true;
  }
  return false;
}

size_t Exchange::firstPending() const {
  for (size_t i = 0; i < count_; ++i) {
    if (active_[i]) return i;
  }
  return 0;
}

Status Exchange::lostPeer(int global_rank) const {
  const PeerInfo& info = mesh_.peerInfo(global_rank);
  common::Text os;
  os << "lost connection to rank " << global_rank << " (host " << info.host_id << ", pid "
     << info.pid << "): the process exited or closed the connection";
  return common::peerLost(os.str());
}

void addPollFd(std::vector<pollfd>* fds, int fd, short events) {
  for (pollfd& p : *fds) {
    if (p.fd == fd) {
      p.events |= events;
      return;
    }
  }
  fds->push_back(pollfd{fd, events, 0});
}

void Exchange::waitSlice() {
  std::vector<pollfd> fds;        // sockets of pending TCP transfers
  std::vector<pollfd> wake_fds;   // sockets of pending shm pairs (wake bytes of a poll sleep)
  shm::Doorbell* bell = nullptr;
  for (size_t i = 0; i < count_; ++i) {
    if (!active_[i]) continue;
    if (pairs_[i]->kind() == PairKind::kShm) {
      const auto* pair = static_cast<const shm::ShmPair*>(pairs_[i]);
      bell = pair->ownDoorbell();
      addPollFd(&wake_fds, pair->wakeFd(), POLLIN);
    } else {
      const auto* pair = static_cast<const tcp::TcpPair*>(pairs_[i]);
      if (fds.empty() && pair->abortFd() >= 0) addPollFd(&fds, pair->abortFd(), POLLIN);
      addPollFd(&fds, pair->pollFd(), transfers_[i].is_send ? POLLOUT : POLLIN);
    }
  }
  // Control frames still in this rank's outbox may be what a peer waits for: flush them and
  // look again soon while some remain (Note [Control over shm] C).
  const int slice_ms = mesh_.flushControl() ? 1 : kSliceMilliseconds;
  if (bell == nullptr) {
    ::poll(fds.data(), fds.size(), slice_ms);
  } else if (fds.empty()) {
    shm::waitDoorbell(bell, [this] { return mesh_.aborted() || shmReady(); },
                      int64_t{slice_ms} * 1000);
  } else {
    waitMixed(&fds, wake_fds, bell, slice_ms);
  }
}

// Both kinds pending: a futex cannot watch sockets, so sleep in poll() and let shm peers wake
// us with a byte on the pair socket (a poll sleep, Note [Doorbell ordering]).
void Exchange::waitMixed(std::vector<pollfd>* fds, const std::vector<pollfd>& wake_fds,
                         shm::Doorbell* bell, int slice_ms) {
  const size_t first_wake = fds->size();
  fds->insert(fds->end(), wake_fds.begin(), wake_fds.end());
  shm::beginPollSleep(bell);
  if (!mesh_.aborted() && !shmReady()) ::poll(fds->data(), fds->size(), slice_ms);
  shm::endSleep(bell);
  for (size_t k = first_wake; k < fds->size(); ++k) {
    if ((*fds)[k].revents & POLLIN) shm::drainWakeBytes((*fds)[k].fd);
  }
}

std::string formatSeconds(double seconds) {
  common::Text os;
  os << seconds;
  return os.str();
}

}  // namespace

Comm::Comm(Mesh& mesh, std::vector<int> members, double timeout_seconds,
           int64_t spin_microseconds)
    : mesh_(mesh), members_(std::move(members)), timeout_seconds_(timeout_seconds),
      spin_microseconds_(std::max<int64_t>(0, spin_microseconds)) {
  for (int i = 0; i < static_cast<int>(members_.size()); ++i) {
    if (members_[i] == mesh_.rank()) rank_ = i;
    if (mesh_.sameHost(members_[i], mesh_.rank())) local_members_.push_back(i);
  }
  HVD_CHECK(rank_ >= 0);
}

bool Comm::sameHost(int set_rank) const {
  return mesh_.sameHost(members_[set_rank], mesh_.rank());
}

Status Comm::exchange(Transfer* transfers, size_t count) {
  if (mesh_.aborted()) return common::aborted("aborted");
  Exchange x(mesh_, members_, rank_, transfers, count);
  HVD_RETURN_IF_ERROR(x.start());
  auto last_progress = Clock::now();
  auto last_liveness_check = last_progress;
  const auto timeout = std::chrono::duration<double>(timeout_seconds_);
  const auto spin = std::chrono::microseconds(spin_microseconds_);
  bool progressed = false;
  while (true) {
    HVD_RETURN_IF_ERROR(x.tryAll(&progressed));  // A
    if (x.allDone()) return Status::ok();        // B
    if (mesh_.aborted()) return common::aborted("aborted");  // C
    const auto now = Clock::now();
    if (progressed) {
      last_progress = now;
      continue;
    }
    if (now - last_liveness_check >= kLivenessInterval) {  // C
      last_liveness_check = now;
      const int lost = mesh_.findLostPeer();
      // A peer's last bytes precede its hang-up, so one more try sees all it ever sent.
      if (lost >= 0) {
        HVD_RETURN_IF_ERROR(x.tryAll(&progressed));
        if (!progressed) return x.lostPeer(lost);
        continue;
      }
    }
    if (now - last_progress >= timeout) {
      Pair* pair = x.pairOf(x.firstPending());
      return common::timedOut("timed out after " + formatSeconds(timeout_seconds_) +
                              " s waiting for rank " + std::to_string(pair->peer()) + " over " +
                              (pair->kind() == PairKind::kShm ? "shm" : "tcp"));
    }
    const auto spin_end = now + spin;  // D
    while (!progressed && Clock::now() < spin_end) {
      common::spinPause(mesh_.spinYields());
      HVD_RETURN_IF_ERROR(x.tryAll(&progressed));
    }
    if (!progressed) x.waitSlice();  // E, then back to A
  }
}

Status Comm::send(int peer, const void* data, size_t bytes) {
  Transfer t;
  t.peer = peer;
  t.is_send = true;
  t.data = const_cast<void*>(data);
  t.bytes = bytes;
  return exchange(&t, 1);
}

Status Comm::recv(int peer, void* data, size_t bytes) {
  Transfer t;
  t.peer = peer;
  t.is_send = false;
  t.data = data;
  t.bytes = bytes;
  return exchange(&t, 1);
}

}  // namespace hvd::transport
