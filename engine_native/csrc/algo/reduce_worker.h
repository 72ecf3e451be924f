// ReduceWorker: a helper thread that runs one reduceInto() at a time for the ring reduce-scatter,
// so the reduction of segment k overlaps the Comm::exchange() that receives segment k+1 (the
// exchange must stay on the background thread; the arithmetic need not). One worker per calling
// thread, started on first use; idle, it blocks on a condition variable (0% CPU). It never
// touches a Comm. Used only for segments large enough that a hand-off (a few microseconds) is
// small against the reduction itself.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <thread>

#include "common/dtype.h"

namespace hvd::algo {

class ReduceWorker {
 public:
  // The worker owned by the calling thread (joined when that thread exits).
  static ReduceWorker& forThisThread();

  ReduceWorker();
  ~ReduceWorker();
  ReduceWorker(const ReduceWorker&) = delete;
  ReduceWorker& operator=(const ReduceWorker&) = delete;

  // Starts dst[i] = dst[i] (op) src[i] on the worker. At most one job is outstanding: the
  // caller waits before posting the next one. dst/src must stay untouched until wait().
  void post(void* dst, const void* src, size_t count, common::DataType dtype, common::ReduceOp op);
  // Returns when the posted job (if any) has finished.
  void wait();

 private:
  struct Job {
    void* dst = nullptr;
    const void* src = nullptr;
    size_t count = 0;
    common::DataType dtype = common::DataType::kFloat32;
    common::ReduceOp op = common::ReduceOp::kSum;
  };
  void run();

  std::mutex mutex_;
  std::condition_variable wake_worker_;
  std::condition_variable job_done_;
  Job job_;
  bool has_job_ = false;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace hvd::algo
