// BackgroundLoop's point-to-point submissions (Note [Caller drives] H) and awaitPeer
// (background_loop.h): a caller blocked on a point-to-point op sleeps on its rank's peer
// doorbell and reads the message that wakes it.
//
// Note [Caller sleeps on the doorbell]
// A pipeline stage's receive mostly waits for its neighbour's compute: its drive's spin runs
// out, or is backed off (Note [Caller drives] H), and the caller blocks. The message then
// reached it through two sleeping hand-offs: the writer's wake byte woke this rank's loop
// thread, whose pass read the frame and completed the handle, whose condition variable woke
// the caller — each a scheduler wake-up, ~20 us with a core free and up to a millisecond on a
// host whose cores the ranks fill (bench_pipeline.py's hand-off-bound step). Instead the
// caller sleeps on the peer doorbell itself and is the one woken:
//   A. Under progress_, it announces kCallerSleeps (Doorbell::driving), re-checks the rings
//      (PeerOps::announceCallerSleep) and then FUTEX_WAITs on the doorbell's sequence: Note
//      [Doorbell ordering] with the bit for `sleeping`. A writer that sees the bit FUTEX_WAKEs
//      it instead of sending the loop thread a wake byte (wakeIfSleeping); the woken caller
//      takes progress_, clears the bit and runs one point-to-point pass (as an isend's, Note
//      [Caller drives] H), which reads the frame into its receive.
//   B. The bit is set, and normally cleared, under progress_, each clearing followed by a
//      point-to-point pass, so a frame whose writer saw the bit (and woke only the caller) is
//      read. A woken caller that finds a pass running (the loop thread's, another caller's)
//      clears the bit at once, wakes the loop thread and blocks on its handle: the running
//      pass, or the loop's next, reads what came (both re-check the rings before they sleep).
//   C. Others may finish the op meanwhile (a pass of the loop thread woken for something
//      else, another caller's drive, a failure, abort): HandleTable::setWaker makes that
//      completion ring the doorbell too.
//   D. The loop thread keeps everything else: control channels, device completions, and the
//      sockets, whose hang-up (a lost peer) fails the op, which C answers.
//   E. One caller at a time (peer_sleeper_); another blocks on its handle as before, and a
//      writer wakes the sleeping one even while that other drives (wakeIfSleeping), since its
//      drive may give up after its last read. Only where callers drive (every peer on shared
//      memory, Note [Caller drives] D): a frame over TCP rings no doorbell. The binding calls
//      this in its 50 ms slices, so Ctrl-C is seen between them as before.
//   F. The mesh is touched under progress_ after failed_/finished_ were checked, except the
//      clearing of B without the lock, which goes through Mesh::markPeerDoorbell (safe against
//      close(); under progress_ the bit is marked directly, as a drive's is); and
//      shutdown() waits for the caller to leave before the mesh can go.
#include <algorithm>

#include "runtime/background_loop.h"
#include "transport/shm/segment.h"

namespace hvd::runtime {

using common::Status;

namespace {

void ringDoorbell(void* doorbell) {  // C
  transport::shm::wakeAlways(static_cast<transport::shm::Doorbell*>(doorbell));
}

}  // namespace

Status BackgroundLoop::submitSend(PeerSend send, bool wait_now, int64_t* handle) {
  const bool drivable = peer_drive_.drivable();  // D, H
  HVD_RETURN_IF_ERROR(peer_ops_.submitSend(std::move(send),
                                           /*caller_waits=*/wait_now || drivable,
                                           /*wake=*/!drivable, handle));
  if (!wait_now && drivable) progressEagerly(*handle, /*is_send=*/true);
  return Status::ok();
}

Status BackgroundLoop::submitRecv(const PeerRecv& recv, bool wait_now, int64_t* handle) {
  const bool drivable = peer_drive_.drivable();  // D, H
  HVD_RETURN_IF_ERROR(peer_ops_.submitRecv(recv, /*caller_waits=*/wait_now || drivable,
                                           /*wake=*/!drivable, handle));
  if (!wait_now && drivable) progressEagerly(*handle, /*is_send=*/false);
  return Status::ok();
}

// A posted receive needs no loop thread awake: a message for it wakes a sleeping loop through
// the peer doorbell (Note [Point-to-point over shm] B), or a caller waiting on it reads it. A
// send not written in this pass (the ring is full) does: it must be flushed as room appears.
void BackgroundLoop::progressEagerly(int64_t handle, bool is_send) {
  {
    std::unique_lock<std::timed_mutex> lock(progress_, std::try_to_lock);
    if (lock.owns_lock() && !failed_ && !finished_ && !shutdown_sent_) {
      bool took_work = false;
      progressPeerOps(&took_work);
      if (!is_send || handles_.poll(handle) != 0) return;
    }
  }
  queue_.wakeIfAsleep();
}

bool BackgroundLoop::awaitPeer(int64_t handle, std::chrono::milliseconds slice) {
  if (!peer_drive_.drivable() || !handles_.pointToPoint(handle)) return false;
  if (peer_sleeper_.exchange(true)) return false;  // E
  struct Leave {
    std::atomic<bool>& sleeper;
    ~Leave() { sleeper.store(false); }
  } leave{peer_sleeper_};
  const auto end = Clock::now() + slice;
  bool announced = false;
  while (true) {
    std::unique_lock<std::timed_mutex> lock(progress_, std::defer_lock);
    if (!lock.try_lock_for(kLockSlice)) {  // B: a pass runs; it or the loop reads the rest
      if (announced) {  // F: without progress_, through the mesh's doorbell lock
        mesh_.markPeerDoorbell(transport::shm::kCallerSleeps, false);
        queue_.wakeIfAsleep();
        queue_.wakeForWaiter();  // a napping loop too (Note [Coalesced wakes])
      }
      return false;
    }
    if (announced) peer_ops_.endCallerSleep();  // B: the pass below reads the rings
    announced = false;
    if (failed_ || finished_) return false;  // F
    bool took_work = false;
    progressPeerOps(&took_work);
    if (handles_.poll(handle) != 0) return true;
    const auto now = Clock::now();
    if (now >= end) return true;
    if (failed_ || queue_.shutdownRequested() || queue_.abortRequested()) {
      return false;  // the handle tells the rest
    }
    uint32_t seen = 0;
    transport::shm::Doorbell* bell = peer_ops_.announceCallerSleep(&seen);  // A
    announced = true;
    if (bell == nullptr) continue;  // a ring moves already: read it
    if (!handles_.setWaker(handle, ringDoorbell, bell)) continue;  // C: it just finished
    lock.unlock();
    const auto left = std::chrono::duration_cast<std::chrono::microseconds>(end - now);
    transport::shm::futexWait(&bell->sequence, seen, std::max<int64_t>(1, left.count()));
    handles_.clearWaker();
  }
}

}  // namespace hvd::runtime
