// TensorEntry: one enqueued op as the background thread sees it — the Request it negotiates and
// the caller's buffers it executes on. Created by a framework thread in Runtime::enqueue, owned
// by the background thread after submission. The Python caller keeps the buffers alive until
// the handle completes (Note [Handle lifetime] in handle_table.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "coord/message.h"

namespace hvd::runtime {

struct TensorEntry {
  coord::Request request;
  const void* input = nullptr;
  void* output = nullptr;   // allreduce / broadcast; others get an OutputBuffer
  int64_t handle = 0;
  std::chrono::steady_clock::time_point enqueued;
};

using EntryKey = std::pair<int32_t, std::string>;  // (process set, name)
using EntryTable = std::map<EntryKey, TensorEntry>;

}  // namespace hvd::runtime
