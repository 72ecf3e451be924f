// cpuRelax(): the pause hint inside the core's bounded spins (HVD_SPIN_US, HVD_CALLER_SPIN_US):
// it tells the CPU (and a hyper-thread sibling) that this thread is only waiting. Any thread.
#pragma once

namespace hvd::common {

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace hvd::common
