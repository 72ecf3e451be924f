// WriterThread: the thread that drains the timeline's ring into the TraceWriter (file and live
// strip) every flush interval, at a low priority. Owned by Timeline, which starts and stops it
// from its control calls (under its control mutex) whenever what is listening changes. The
// recording calls never touch it: they only push into the ring.
#pragma once

#include <condition_variable>
#include <mutex>
#include <thread>

#include "timeline/spsc_ring.h"
#include "timeline/timeline_record.h"
#include "timeline/trace_writer.h"

namespace hvd::timeline {

class WriterThread {
 public:
  WriterThread(SpscRing<TimelineRecord>* ring, TraceWriter* writer, int flush_interval_ms);
  ~WriterThread() { stop(); }
  WriterThread(const WriterThread&) = delete;
  WriterThread& operator=(const WriterThread&) = delete;

  // Starts the thread; false (logged, nothing running) if the system refuses one.
  bool start();
  // Wakes the thread, lets it write out everything recorded so far, and joins it. No-op when
  // not running. The writer is this thread's alone between start() and stop().
  void stop();

 private:
  void loop();

  SpscRing<TimelineRecord>* const ring_;  // consumer side
  TraceWriter* const writer_;
  const int flush_interval_ms_;
  std::thread thread_;
  std::mutex wake_mutex_;  // guards stop_ with wake_
  std::condition_variable wake_;
  bool stop_ = false;
};

}  // namespace hvd::timeline
