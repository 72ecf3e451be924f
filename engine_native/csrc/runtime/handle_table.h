// HandleTable: the async handles framework threads hold. enqueue() creates one; the background
// thread completes it (Status + result); poll() reads it without blocking; wait() blocks on a
// condition variable in short slices so the binding can check for signals between slices.
// Thread-safe. Note [Handle lifetime]: a handle lives until the caller releases it (wait()
// releases after returning), so a completed op's result stays readable until then.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace hvd::runtime {

// Core-owned output memory of allgather / alltoall / reducescatter, 64-byte aligned.
struct OutputBuffer {
  explicit OutputBuffer(size_t bytes);
  ~OutputBuffer();
  OutputBuffer(const OutputBuffer&) = delete;
  OutputBuffer& operator=(const OutputBuffer&) = delete;
  uint8_t* data = nullptr;
  size_t bytes = 0;
};

struct OpResult {
  std::shared_ptr<OutputBuffer> buffer;   // null for in-place ops
  std::vector<int64_t> shape;
  std::vector<int64_t> received_splits;   // alltoall
  int32_t last_joined_rank = -1;          // join
};

class HandleTable {
 public:
  // caller_waits: submitted by a caller that waits for it at once (enqueue_for_wait), whose
  // wait may drive it (Note [Caller drives]).
  int64_t create(bool caller_waits = false);
  bool callerWaits(int64_t handle) const;
  void complete(int64_t handle, common::Status status, OpResult result = {});
  // -1: unknown handle, 0: pending, 1: done.
  int poll(int64_t handle) const;
  // Waits up to `slice_ms`; true when done (status/result filled).
  bool waitFor(int64_t handle, int slice_ms, common::Status* status, OpResult* result);
  void release(int64_t handle);
  // Completes every pending handle with `status` (shutdown / abort / lost peer).
  void failAll(const common::Status& status);

 private:
  struct State {
    bool done = false;
    bool caller_waits = false;
    common::Status status;
    OpResult result;
  };
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::unordered_map<int64_t, State> states_;
  int64_t next_ = 1;
};

}  // namespace hvd::runtime
