// CoreHeadroom: whether the host has a core free for a spinning thread right now (Note [Spin
// while a core is free] in core_headroom.cc). Any thread; no state but a file descriptor.
#pragma once

namespace hvd::runtime {

class CoreHeadroom {
 public:
  // `cores`: the CPUs the host's ranks may use (the process's mask before any binding);
  // 0 for a rank not bound to CPUs of its own: it never asks, and /proc/loadavg is not opened.
  explicit CoreHeadroom(int cores);
  ~CoreHeadroom();
  CoreHeadroom(const CoreHeadroom&) = delete;
  CoreHeadroom& operator=(const CoreHeadroom&) = delete;

  // True when the host runs (or has runnable) no more threads than `cores`, the caller itself
  // counted; false when that cannot be read.
  bool coreFree() const;

 private:
  int loadavg_fd_ = -1;  // /proc/loadavg, read with pread from any thread
  int cores_ = 0;
  int forced_ = -1;      // HVD_TEST_CORE_FREE: 1 or 0 answers every call (tests); -1 unset
};

// The running-and-runnable thread count in /proc/loadavg's text ("0.46 1.04 2.16 3/90 31139":
// 3), or -1 when the text has none.
long runningThreads(const char* loadavg);

}  // namespace hvd::runtime
