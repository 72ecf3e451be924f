// HandleTable: the async handles framework threads hold. enqueue() creates one; the background
// thread completes it (Status + result); poll() reads it without blocking; wait() blocks on a
// condition variable in short slices so the binding can check for signals between slices.
// Thread-safe. Note [Handle lifetime]: a handle lives until the caller releases it (wait()
// releases after returning), so a completed op's result stays readable until then.
// Handles are slots of a slab plus a generation (a released handle is recognised as unknown
// even after its slot is reused); completing wakes the condition variable only when some
// thread is blocked on it, so a batch of 200 completions costs one lock and at most one wake.
// A handle also holds its op's tensor name (Note [Name lifetime]).
//
// Note [Name lifetime]
// A tensor name is taken from the submission of its op until the user has seen the op finish:
// wait() returned (takeIfDone, or release after waitFor) or poll() answered done (observe) —
// whether the op succeeded or failed. Submitting the name again before that raises ValueError
// on this rank, every time; right after it, the name is free. (Horovod frees a name when its
// op starts executing, so a duplicate is caught only while the first op is still queued.) The
// handle holds the name's key in the loop's KeyTable (coord/key_table.h, Note [Key lifetime] D)
// and releases it with the handle. A failed core, shutdown and abort free every name at once;
// the loop detaches its KeyTable before it goes, and handles it created release nothing after.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "common/status.h"
#include "coord/key_table.h"

namespace hvd::runtime {

// Core-owned output memory of allgather / alltoall / reducescatter: host memory, 64-byte
// aligned, or a block of a CUDA device that `release` hands back (runtime/device_output_pool.h)
// after the stream its users run on (`release_stream`: the stream current when the binding
// wrapped it, or a stream-ordered receive's consumer; 0, the legacy stream, until then).
struct OutputBuffer {
  explicit OutputBuffer(size_t bytes);
  OutputBuffer(uint8_t* data, size_t bytes, int device, size_t capacity,
               void (*release)(OutputBuffer&));
  ~OutputBuffer();
  OutputBuffer(const OutputBuffer&) = delete;
  OutputBuffer& operator=(const OutputBuffer&) = delete;
  uint8_t* data = nullptr;
  size_t bytes = 0;
  int device = -1;  // -1: host memory
  size_t capacity = 0;  // of the device block
  uintptr_t release_stream = 0;
  void (*release)(OutputBuffer&) = nullptr;
};

struct OpResult {
  std::shared_ptr<OutputBuffer> buffer;   // null for in-place ops
  std::vector<int64_t> shape;
  std::vector<int64_t> received_splits;   // alltoall
  int32_t last_joined_rank = -1;          // join
  int32_t dtype = -1;                     // a point-to-point receive: the message's dtype code
};

class HandleTable {
 public:
  // caller_waits: submitted by a caller that waits for it at once (enqueue_for_wait), whose
  // wait may drive it (Note [Caller drives]). name: the op's key, acquired in the attached
  // KeyTable; the handle releases it (Note [Name lifetime]).
  // point_to_point: a send or receive (runtime/peer_ops.h), whose wait may be for a peer's
  // compute rather than for bytes (Note [Caller drives] H).
  int64_t create(bool caller_waits = false, coord::Key name = coord::Key(),
                 bool point_to_point = false);
  // The background loop's KeyTable, whose keys handles created from now on hold; detach()
  // with the returned epoch before the table goes (a later loop's attach wins).
  uint32_t attachNames(coord::KeyTable* keys);
  void detachNames(uint32_t epoch);
  bool callerWaits(int64_t handle) const;
  bool pointToPoint(int64_t handle) const;
  void complete(int64_t handle, common::Status status, OpResult result = {});
  // Completes several handles with `status` under one lock: each with `result`, or, when
  // `each` is given, handles[i] with each[i] (moved from).
  void completeMany(const int64_t* handles, size_t count, const common::Status& status,
                    const OpResult& result, OpResult* each = nullptr);
  // -1: unknown handle, 0: pending, 1: done.
  int poll(int64_t handle) const;
  // poll() for the user: once done, the op's name is free again (Note [Name lifetime]).
  int observe(int64_t handle);
  // Waits up to `slice_ms`; true when done (status/result filled).
  bool waitFor(int64_t handle, int slice_ms, common::Status* status, OpResult* result);
  // When done: fills status/result, releases the handle (and its name) and returns true, all
  // under one lock (the fast path of a wait whose op already finished). False when pending or
  // unknown.
  bool takeIfDone(int64_t handle, common::Status* status, OpResult* result);
  // Forgets the handle and frees its name.
  void release(int64_t handle);
  // One thread at a time may wait for `handle` elsewhere than in waitFor (a point-to-point
  // wait asleep on its rank's peer doorbell, Note [Point-to-point over shm] G in
  // transport/peer_channel.cc): completing the handle then calls wake(arg), outside the lock.
  // False, with nothing set, when the handle is done or unknown. clearWaker() when it stops.
  bool setWaker(int64_t handle, void (*wake)(void*), void* arg);
  void clearWaker();

  // A caller is inside wait() (driving its op or blocked), from before it drives until it
  // returns: rank 0 does not hold a batch for more of its own tensors while its caller cannot
  // submit them (Note [Batching window] in runtime/batching_window.cc).
  class WaitScope {
   public:
    explicit WaitScope(HandleTable& table) : table_(table) { table_.callers_in_wait_.fetch_add(1); }
    ~WaitScope() { table_.callers_in_wait_.fetch_sub(1); }
    WaitScope(const WaitScope&) = delete;
    WaitScope& operator=(const WaitScope&) = delete;

   private:
    HandleTable& table_;
  };
  bool callerInWait() const { return callers_in_wait_.load() > 0; }

 private:
  struct State {
    uint32_t generation = 0;  // odd while in use
    bool done = false;
    bool caller_waits = false;
    bool point_to_point = false;
    common::Status status;
    OpResult result;
    uint32_t next_free = 0;
    coord::Key name;            // held in names_ while assigned (Note [Name lifetime])
    uint32_t names_epoch = 0;   // the attach it was acquired under
  };
  State* find(int64_t handle);
  const State* find(int64_t handle) const;
  void freeName(State* state);
  void freeSlot(int64_t handle, State* state);

  struct Waker {
    int64_t handle = 0;  // handles are positive: 0 matches none
    void (*wake)(void*) = nullptr;
    void* arg = nullptr;
  };

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  Waker waker_;  // setWaker
  std::vector<State> slots_;
  uint32_t free_head_ = kNoSlot;
  int waiters_ = 0;  // threads blocked in waitFor
  std::atomic<int> callers_in_wait_{0};  // WaitScope
  coord::KeyTable* names_ = nullptr;  // the live loop's, or null
  uint32_t names_epoch_ = 0;
  static constexpr uint32_t kNoSlot = 0xffffffffu;
};

}  // namespace hvd::runtime
