// ReduceWorker: see algo/reduce_worker.h. Hand-off protocol, all under mutex_:
//   A. post(): the caller stores the job, sets has_job_, wakes the worker.
//   B. run(): the worker takes the job (has_job_ stays set), reduces without the lock, then
//      clears has_job_ and signals job_done_.
//   C. wait(): the caller sleeps until has_job_ is false.
// The mutex hand-offs order the worker's writes to dst before the caller's next read of it.
#include "algo/reduce_worker.h"

namespace hvd::algo {

ReduceWorker& ReduceWorker::forThisThread() {
  thread_local ReduceWorker worker;
  return worker;
}

ReduceWorker::ReduceWorker() : thread_([this] { run(); }) {}

ReduceWorker::~ReduceWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_worker_.notify_one();
  thread_.join();
}

void ReduceWorker::post(void* dst, const void* src, size_t count, common::DataType dtype,
                        common::ReduceOp op) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = Job{dst, src, count, dtype, op};
    has_job_ = true;
  }
  wake_worker_.notify_one();
}

void ReduceWorker::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  job_done_.wait(lock, [this] { return !has_job_; });
}

void ReduceWorker::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_worker_.wait(lock, [this] { return has_job_ || stop_; });
    if (stop_) return;
    const Job job = job_;
    lock.unlock();
    common::reduceInto(job.dst, job.src, job.count, job.dtype, job.op);
    lock.lock();
    has_job_ = false;
    job_done_.notify_one();
  }
}

}  // namespace hvd::algo
