#include "timeline/writer_thread.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <system_error>

#include "common/logging.h"

namespace hvd::timeline {

namespace {

// Formatting and I/O must never take a core from the communication threads, which on a
// machine with fewer cores than runnable threads is what an extra thread does when it wakes:
// SCHED_BATCH (a wake-up does not preempt the running thread) at nice 10 (about a tenth of a
// core's share against nice-0 threads; idle cores it uses freely). Failure is harmless.
void lowerWriterPriority() {
  sched_param param{};
  param.sched_priority = 0;
  pthread_setschedparam(pthread_self(), SCHED_BATCH, &param);
  setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 10);
}

}  // namespace

WriterThread::WriterThread(SpscRing<TimelineRecord>* ring, TraceWriter* writer,
                           int flush_interval_ms)
    : ring_(ring), writer_(writer), flush_interval_ms_(flush_interval_ms) {}

bool WriterThread::start() {
  try {
    thread_ = std::thread([this] { loop(); });
    return true;
  } catch (const std::system_error& e) {
    HVD_LOG(kWarning, "timeline") << "timeline: cannot start the writer thread (" << e.what()
                                  << "); recording is off";
    return false;
  }
}

void WriterThread::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(wake_mutex_);
    stop_ = true;
  }
  wake_.notify_one();
  thread_.join();
  stop_ = false;
}

// Drains every flush interval while events flow; when idle, backs off to kIdleFlush so an idle
// rank wakes rarely; an event still reaches the file within max(interval, 80 ms).
void WriterThread::loop() {
  constexpr std::chrono::milliseconds kIdleFlush(80);
  const auto base = std::chrono::milliseconds(std::max(1, flush_interval_ms_));
  auto interval = base;
  lowerWriterPriority();
  for (;;) {
    const size_t groups = writer_->drain(*ring_);
    writer_->flush();
    interval = groups > 0 ? base : std::min(interval * 2, std::max(base, kIdleFlush));
    std::unique_lock<std::mutex> lock(wake_mutex_);
    if (!stop_ && groups * 4 < ring_->capacity()) {
      wake_.wait_for(lock, interval, [this] { return stop_; });
    }
    if (stop_) {
      // Everything recorded before the stop request is in the ring now: write it out.
      lock.unlock();
      writer_->drain(*ring_);
      writer_->flush();
      return;
    }
  }
}

}  // namespace hvd::timeline
