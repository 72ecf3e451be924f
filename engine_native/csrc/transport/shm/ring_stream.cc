// RingStream (transport/shm/ring_stream.h).
//
// Note [Control over shm]
// Every op negotiates: a worker's request to rank 0 and rank 0's response back. Over loopback
// TCP each message cost a send() and, on the receiving side, a recv() on every pass of the
// loop (or of a spinning caller) whether anything had come: perf of 4 B allgathers at np=2
// showed 54% of the CPU in the kernel, mostly the TCP stack, and ~12 us per op. Between ranks
// of one host the frames now go through a ring in shared memory; the socket carries no frames.
//   A. The receiver's rings are read on every pass (a load when empty, no syscall).
//   B. A loop thread about to poll() its control sockets first announces kPollSleep on its
//      segment's control doorbell and re-checks its incoming control rings; a writer that sees
//      kPollSleep after its write sends one wake byte on the socket (the protocol of Note
//      [Doorbell ordering], so no message is left unseen by a sleeper). A loop in standby
//      (Note [Caller drives] B) does not watch control messages and does not announce.
//   C. A send never waits for room. What the ring cannot take stays in the channel's outbox,
//      flushed on every pass; the writer marks the ring (writer_waiting), and the reader, after
//      reading, wakes the writer's loop the same way. (Waiting for room inside the send
//      deadlocked: a worker blocked sending 200 KiB of requests to rank 0 while rank 0 sat in
//      an agreed collective waiting for that worker. A TCP socket's megabytes of buffer had
//      hidden it.) The mark is a Dekker pair too: the writer stores it, then retries the
//      write; the reader stores the new tail, then takes the mark. A reader that takes the
//      mark before the writer's loop announced its sleep wakes nobody, so that loop flushes
//      once more after announcing (B): bytes move and it goes on, or a fresh mark is left for
//      the reader to answer (the loss cost up to the 200 ms tick).
//   D. The socket's hang-up (poll readable, recv 0) is still how the loop sees a lost peer;
//      wake bytes are drained when poll() reported the socket readable. A hang-up is reported
//      after the ring is read once more: the peer wrote its last frames (a failure's cause)
//      before it closed, maybe after this rank's first read of the ring.
#include "transport/shm/ring_stream.h"

namespace hvd::transport::shm {

size_t RingStream::write(const uint8_t* data, size_t n) {
  size_t done = link_.outgoing.write(data, n);
  if (done < n) {  // C
    link_.outgoing.markWriterWaiting();
    done += link_.outgoing.write(data + done, n - done);
  }
  if (wakeAfterWrite(done, n)) link_.wakePeer();  // B
  return done;
}

size_t RingStream::writeGather(const iovec* pieces, int count, bool always_wake) {
  size_t done = 0, asked = 0;
  for (int k = 0; k < count; ++k) asked += pieces[k].iov_len;
  for (int k = 0; k < count; ++k) {
    const auto* data = static_cast<const uint8_t*>(pieces[k].iov_base);
    const size_t n = pieces[k].iov_len;
    size_t wrote = link_.outgoing.write(data, n);
    if (wrote < n) {  // C
      link_.outgoing.markWriterWaiting();
      wrote += link_.outgoing.write(data + wrote, n - wrote);
    }
    done += wrote;
    if (wrote < n) break;
  }
  if (wakeAfterWrite(done, asked, always_wake)) link_.wakePeer();  // B
  return done;
}

// After the ring's head was stored (seq_cst): `listening` is loaded after it, so a receive
// opened before the write is seen here, or the peer's check of its rings after opening it sees
// the bytes (Note [Doorbell ordering]'s pair, with `listening` for `sleeping`).
bool RingStream::wakeAfterWrite(size_t written, size_t asked, bool always_wake) const {
  if (written == 0) return false;
  if (always_wake || wakes_ == Wakes::kEveryWrite || written < asked) return true;
  return link_.peer_doorbell->listening.load(std::memory_order_seq_cst) != 0;
}

bool RingStream::rearm() {
  link_.outgoing.markWriterWaiting();
  return link_.outgoing.hasSpace();
}

size_t RingStream::read(uint8_t* dst, size_t n) {
  const size_t got = link_.incoming.read(dst, n);
  if (got > 0 && link_.incoming.takeWriterWaiting()) link_.wakePeer();
  return got;
}

}  // namespace hvd::transport::shm
