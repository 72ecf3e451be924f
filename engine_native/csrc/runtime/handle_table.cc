#include "runtime/handle_table.h"

#include <chrono>
#include <cstdlib>

namespace hvd::runtime {

namespace {
// handle = generation << 32 | slot. Generations are odd while a slot is in use, so a handle is
// never 0 and a released handle (its slot's generation moved on) is unknown. They count
// modulo 2^31 (parity kept), so a handle stays positive however often a slot is reused.
uint32_t nextGeneration(uint32_t g) { return (g + 1) & 0x7fffffffu; }

int64_t makeHandle(uint32_t slot, uint32_t generation) {
  return static_cast<int64_t>((static_cast<uint64_t>(generation) << 32) | slot);
}
uint32_t slotOf(int64_t handle) { return static_cast<uint32_t>(handle & 0xffffffff); }
uint32_t generationOf(int64_t handle) { return static_cast<uint32_t>(handle >> 32); }
}  // namespace

OutputBuffer::OutputBuffer(size_t n) : bytes(n) {
  // aligned_alloc needs a size that is a multiple of the alignment (and non-zero).
  size_t rounded = ((n + 63) / 64) * 64;
  data = static_cast<uint8_t*>(std::aligned_alloc(64, rounded == 0 ? 64 : rounded));
}

OutputBuffer::OutputBuffer(uint8_t* d, size_t n, int dev, size_t block,
                           void (*give_back)(OutputBuffer&))
    : data(d), bytes(n), device(dev), capacity(block), release(give_back) {}

OutputBuffer::~OutputBuffer() {
  if (release != nullptr) {
    if (data != nullptr) release(*this);
  } else {
    std::free(data);
  }
}

HandleTable::State* HandleTable::find(int64_t handle) {
  if (handle <= 0) return nullptr;
  const uint32_t slot = slotOf(handle);
  if (slot >= slots_.size() || slots_[slot].generation != generationOf(handle)) return nullptr;
  return &slots_[slot];
}

const HandleTable::State* HandleTable::find(int64_t handle) const {
  return const_cast<HandleTable*>(this)->find(handle);
}

int64_t HandleTable::create(bool caller_waits, coord::Key name, bool point_to_point) {
  std::lock_guard<std::mutex> lock(mutex_);
  uint32_t slot = free_head_;
  if (slot != kNoSlot) {
    free_head_ = slots_[slot].next_free;
  } else {
    slot = static_cast<uint32_t>(slots_.size());
    slots_.emplace_back();
  }
  State& state = slots_[slot];
  state.generation = nextGeneration(state.generation);  // even (free) -> odd (in use)
  state.done = false;
  state.caller_waits = caller_waits;
  state.point_to_point = point_to_point;
  state.name = name;
  state.names_epoch = names_epoch_;
  return makeHandle(slot, state.generation);
}

uint32_t HandleTable::attachNames(coord::KeyTable* keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  names_ = keys;
  return ++names_epoch_;
}

void HandleTable::detachNames(uint32_t epoch) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (epoch == names_epoch_) names_ = nullptr;
}

// Under mutex_, which also orders it before detachNames: the KeyTable is alive here.
void HandleTable::freeName(State* state) {
  if (!state->name.assigned()) return;
  if (names_ != nullptr && state->names_epoch == names_epoch_) names_->release(&state->name, 1);
  state->name = coord::Key();
}

void HandleTable::freeSlot(int64_t handle, State* state) {
  freeName(state);
  state->generation = nextGeneration(state->generation);  // odd -> even: copies are unknown
  state->status = common::Status();
  state->result = OpResult();
  state->next_free = free_head_;
  free_head_ = slotOf(handle);
}

bool HandleTable::callerWaits(int64_t handle) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const State* state = find(handle);
  return state != nullptr && state->caller_waits && !state->done;
}

bool HandleTable::pointToPoint(int64_t handle) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const State* state = find(handle);
  return state != nullptr && state->point_to_point;
}

void HandleTable::complete(int64_t handle, common::Status status, OpResult result) {
  bool wake = false;
  Waker waker;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    State* state = find(handle);
    if (state == nullptr || state->done) return;
    state->done = true;
    state->status = std::move(status);
    state->result = std::move(result);
    wake = waiters_ > 0;
    if (handle == waker_.handle) waker = waker_;
  }
  if (wake) cv_.notify_all();
  if (waker.wake != nullptr) waker.wake(waker.arg);
}

bool HandleTable::setWaker(int64_t handle, void (*wake)(void*), void* arg) {
  std::lock_guard<std::mutex> lock(mutex_);
  const State* state = find(handle);
  if (state == nullptr || state->done) return false;
  waker_ = Waker{handle, wake, arg};
  return true;
}

void HandleTable::clearWaker() {
  std::lock_guard<std::mutex> lock(mutex_);
  waker_ = Waker{};
}

void HandleTable::completeMany(const int64_t* handles, size_t count,
                               const common::Status& status, const OpResult& result,
                               OpResult* each) {
  if (count == 0) return;
  bool wake = false;
  Waker waker;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < count; ++i) {
      State* state = find(handles[i]);
      if (state == nullptr || state->done) continue;
      if (handles[i] == waker_.handle) waker = waker_;
      state->done = true;
      state->status = status;
      if (each != nullptr) {
        state->result = std::move(each[i]);
      } else {
        state->result = result;
      }
    }
    wake = waiters_ > 0;
  }
  if (wake) cv_.notify_all();
  if (waker.wake != nullptr) waker.wake(waker.arg);
}

int HandleTable::poll(int64_t handle) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const State* state = find(handle);
  if (state == nullptr) return -1;
  return state->done ? 1 : 0;
}

int HandleTable::observe(int64_t handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  State* state = find(handle);
  if (state == nullptr) return -1;
  if (!state->done) return 0;
  freeName(state);
  return 1;
}

bool HandleTable::waitFor(int64_t handle, int slice_ms, common::Status* status, OpResult* result) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto ready = [&] {
    const State* state = find(handle);
    return state == nullptr || state->done;
  };
  if (!ready()) {
    ++waiters_;
    const bool done = cv_.wait_for(lock, std::chrono::milliseconds(slice_ms), ready);
    --waiters_;
    if (!done) return false;
  }
  const State* state = find(handle);
  if (state == nullptr) {
    *status = common::invalidArgument("unknown or already released handle " +
                                      std::to_string(handle));
    return true;
  }
  *status = state->status;
  *result = state->result;
  return true;
}

bool HandleTable::takeIfDone(int64_t handle, common::Status* status, OpResult* result) {
  std::lock_guard<std::mutex> lock(mutex_);
  State* state = find(handle);
  if (state == nullptr || !state->done) return false;
  *status = std::move(state->status);
  *result = std::move(state->result);
  freeSlot(handle, state);
  return true;
}

void HandleTable::release(int64_t handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  State* state = find(handle);
  if (state != nullptr) freeSlot(handle, state);
}

}  // namespace hvd::runtime
