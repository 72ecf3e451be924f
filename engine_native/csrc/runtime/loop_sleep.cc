// The loop thread's sleep (BackgroundLoop, background_loop.h): waitForWork builds its poll set
// under progress_ and sleeps without it; in standby, while callers drive, Note [Caller drives]
// D's park.
#include "runtime/background_loop.h"

#include <poll.h>
#include <time.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "transport/shm/collective_segment.h"

namespace hvd::runtime {

// Builds the poll set under progress_ (it reads pass state), sleeps without it. Returns the
// listening socket when it has a connection to accept (-1 otherwise): run() accepts it under
// progress_, after checking that a driving caller did not close the mesh meanwhile. Fills
// *readable_controls with the ranks whose control socket polled readable, for run() to mark
// (and to end the control doorbell's poll sleep) under progress_ likewise, and
// *readable_peers with those whose point-to-point socket did.
int BackgroundLoop::waitForWork(std::vector<int>* readable_controls,
                                std::vector<int>* readable_peers, bool* idle_tick) {
  std::vector<pollfd> fds;
  std::vector<int> control_ranks;  // of fds[control_begin ...]
  fds.push_back({queue_.wakeFd(), POLLIN, 0});
  int64_t timeout_us = int64_t{kTickMs} * 1000;
  int64_t nap_us = 0;  // > 0: nap instead of sleep (Note [Coalesced wakes])
  size_t listen_index = 0;  // 0: not polled
  size_t control_begin = 0;
  bool control_waiting = false;  // a frame sits in a control or peer ring already
  size_t peer_begin = 0;
  std::vector<int> peer_ranks;   // of fds[peer_begin ...]
  readable_controls->clear();
  readable_peers->clear();
  {
    std::lock_guard<std::timed_mutex> lock(progress_);
    watches_all_ = !failed_ && !queue_.standby();  // Note [Caller drives] I
    if (watches_all_) {  // Note [Caller drives] B
      if (mesh_.listenFd() >= 0) {
        listen_index = fds.size();
        fds.push_back({mesh_.listenFd(), POLLIN, 0});
      }
      // Note [Control over shm] B: announce, then re-check the rings, before the poll.
      if (transport::shm::Doorbell* bell = mesh_.controlDoorbell()) {
        transport::shm::beginPollSleep(bell);
      }
      control_begin = fds.size();
      for (int r = 0; r < mesh_.size(); ++r) {
        transport::ControlChannel* channel = mesh_.control(r);
        if (channel == nullptr) continue;
        fds.push_back({channel->fd(), POLLIN, 0});
        control_ranks.push_back(r);
        control_waiting = control_waiting || channel->hasIncoming();
        // Note [Control over shm] C: a reader that made room before the announcement woke
        // nobody. Flushing after it either moves bytes (go on at once) or leaves a fresh mark,
        // which the reader answers with a wake byte now that the sleep is announced.
        if (channel->hasBacklog() && channel->flush()) control_waiting = true;
      }
    }
    // Point-to-point connections are watched even in standby: a peer's large send must not
    // wait for this rank's next op to be read (Note [Point-to-point]; but see Note [Caller
    // drives] D's park); while shutting down, for the answers this rank owes (F).
    if (!failed_) {
      std::vector<int> peer_fds;
      std::vector<short> peer_events;
      if (peer_ops_.announceSleep()) control_waiting = true;  // a ring can move already
      // Note [One round] E: announced on the same doorbell a post's wake reads. In standby the
      // driving caller finishes the round (a post wakes nobody while it drives).
      if (watches_all_ && one_round_.canProgress()) control_waiting = true;
      peer_ops_.pollSet(&peer_fds, &peer_events, &peer_ranks);
      peer_begin = fds.size();
      for (size_t k = 0; k < peer_fds.size(); ++k) fds.push_back({peer_fds[k], peer_events[k], 0});
    }
    timeout_us = int64_t{timeoutMs()} * 1000;
    const double cycle_time_ms = cycleTimeMs();
    if (cycle_time_ms > 0 && !failed_ && drained_recently_ && !idle()) {
      nap_us = std::max<int64_t>(1, static_cast<int64_t>(cycle_time_ms * 1000));
    }
  }
  auto t0 = Clock::now();
  // Notes [Coalesced wakes] (a nap) and [Wake only a sleeper] (a sleep).
  timeout_us = queue_.beginSleep(timeout_us, nap_us);
  if (control_waiting) timeout_us = 0;
  const timespec ts{static_cast<time_t>(timeout_us / 1000000),
                    static_cast<long>(timeout_us % 1000000) * 1000};
  peer_ops_.setSocketsWatched(!peer_ranks.empty());  // Note [Caller drives] D
  int rc = ::ppoll(fds.data(), fds.size(), &ts, nullptr);
  peer_ops_.setSocketsWatched(false);
  queue_.endSleep();
  metrics_.addWait(std::chrono::duration<double>(Clock::now() - t0).count());
  metrics_.countLoopWakeup();
  *idle_tick = rc == 0 && timeout_us >= int64_t{kTickMs} * 1000;
  if (rc <= 0) return -1;
  for (size_t i = 0; i < control_ranks.size(); ++i) {
    if (fds[control_begin + i].revents != 0) readable_controls->push_back(control_ranks[i]);
  }
  for (size_t i = 0; i < peer_ranks.size(); ++i) {
    if (fds[peer_begin + i].revents & ~POLLOUT) readable_peers->push_back(peer_ranks[i]);
  }
  if (fds[0].revents & POLLIN) {
    queue_.consumeWake();
  } else if (!watches_all_ && caller_driving_.load()) {
    parkWhileCallersDrive();  // only point-to-point sockets woke it (standby polls no others)
  }
  return listen_index > 0 && (fds[listen_index].revents & POLLIN) ? fds[listen_index].fd : -1;
}

// Note [Caller drives] D: off progress_ and off the sockets (a driving caller's passes read
// them meanwhile: PeerOps::setSocketsWatched is false), in kStandbyPark quanta while a caller
// drives or one started in the last quantum, for about an idle tick at most; the pass after
// it reads the sockets that woke the loop and does the tick's work.
void BackgroundLoop::parkWhileCallersDrive() {
  const auto start = Clock::now();
  const auto until = start + std::chrono::milliseconds(kTickMs);
  uint64_t drives = drives_started_.load();
  int quanta = 0;
  queue_.park(kStandbyPark.count(), [this, &drives, &quanta, &until] {
    const uint64_t seen = std::exchange(drives, drives_started_.load());
    if (quanta++ > 0) metrics_.countLoopWakeup();  // (the first ask precedes any sleep)
    return (caller_driving_.load() || drives != seen) && Clock::now() < until;
  });
  metrics_.addWait(std::chrono::duration<double>(Clock::now() - start).count());
}

}  // namespace hvd::runtime
