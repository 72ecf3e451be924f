#include "runtime/handle_table.h"

#include <chrono>
#include <cstdlib>

namespace hvd::runtime {

OutputBuffer::OutputBuffer(size_t n) : bytes(n) {
  // aligned_alloc needs a size that is a multiple of the alignment (and non-zero).
  size_t rounded = ((n + 63) / 64) * 64;
  data = static_cast<uint8_t*>(std::aligned_alloc(64, rounded == 0 ? 64 : rounded));
}

OutputBuffer::~OutputBuffer() { std::free(data); }

int64_t HandleTable::create(bool caller_waits) {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t handle = next_++;
  State state;
  state.caller_waits = caller_waits;
  states_.emplace(handle, std::move(state));
  return handle;
}

bool HandleTable::callerWaits(int64_t handle) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = states_.find(handle);
  return it != states_.end() && it->second.caller_waits && !it->second.done;
}

void HandleTable::complete(int64_t handle, common::Status status, OpResult result) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = states_.find(handle);
    if (it == states_.end() || it->second.done) return;
    it->second.done = true;
    it->second.status = std::move(status);
    it->second.result = std::move(result);
  }
  cv_.notify_all();
}

int HandleTable::poll(int64_t handle) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = states_.find(handle);
  if (it == states_.end()) return -1;
  return it->second.done ? 1 : 0;
}

bool HandleTable::waitFor(int64_t handle, int slice_ms, common::Status* status, OpResult* result) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto ready = [&] {
    auto it = states_.find(handle);
    return it == states_.end() || it->second.done;
  };
  if (!cv_.wait_for(lock, std::chrono::milliseconds(slice_ms), ready)) return false;
  auto it = states_.find(handle);
  if (it == states_.end()) {
    *status = common::invalidArgument("unknown or already released handle " +
                                      std::to_string(handle));
    return true;
  }
  *status = it->second.status;
  *result = it->second.result;
  return true;
}

void HandleTable::release(int64_t handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  states_.erase(handle);
}

void HandleTable::failAll(const common::Status& status) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [handle, state] : states_) {
      if (state.done) continue;
      state.done = true;
      state.status = status;
    }
  }
  cv_.notify_all();
}

}  // namespace hvd::runtime
