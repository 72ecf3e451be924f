// The process's reading thread (transport/shm/helper_read.h).
#include "transport/shm/helper_read.h"

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include "common/test_switch.h"
#include "transport/shm/cross_memory.h"

namespace hvd::transport::shm {

namespace {

struct Reader {
  std::mutex mutex;
  std::condition_variable work;  // a read was queued
  std::condition_variable done;  // a read was released
  std::deque<std::shared_ptr<HelperRead>> queue;
  std::shared_ptr<HelperRead> current;  // the read the thread runs
  pid_t owner = 0;  // the process whose thread serves `queue` (a forked child has none)
};

// Never destroyed: the detached thread waits on it until the process exits.
Reader& reader() {
  static Reader* r = new Reader();
  return *r;
}

void serve(Reader* r) {
  std::unique_lock<std::mutex> lock(r->mutex);
  while (true) {
    r->work.wait(lock, [r] { return !r->queue.empty(); });
    std::shared_ptr<HelperRead> read = std::move(r->queue.front());
    r->queue.pop_front();
    r->current = read;
    lock.unlock();
    // Test switch: the read starts this late (a receive that ends while it runs, the wake).
    if (const char* ms = HVD_TEST_SWITCH("P2P_HELPER_READ_DELAY_MS")) {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::atol(ms)));
    }
    read->status = readPeer(read->pid, read->remote, read->local, read->bytes);
    read->finished.store(true, std::memory_order_seq_cst);
    if (read->on_finished != nullptr) read->on_finished(read->context);
    lock.lock();
    read->released = true;
    r->current = nullptr;
    r->done.notify_all();
  }
}

// Under r.mutex: in a forked child the parent's thread is gone. Its reads (queued, or the one
// it ran) end failed, so nothing waits for them; the child's first read starts a thread.
void ownedHere(Reader& r, bool start) {
  if (r.owner == ::getpid()) return;
  if (r.owner != 0) {
    if (r.current != nullptr) r.queue.push_back(std::move(r.current));
    for (const std::shared_ptr<HelperRead>& read : r.queue) {
      read->status = common::internalError("a helper read of the process this one forked from");
      read->finished.store(true, std::memory_order_seq_cst);
      read->released = true;
    }
    r.queue.clear();
    r.current = nullptr;
    r.owner = 0;
  }
  if (start) {
    r.owner = ::getpid();
    std::thread(serve, &r).detach();
  }
}

}  // namespace

void startHelperRead(std::shared_ptr<HelperRead> read) {
  Reader& r = reader();
  std::lock_guard<std::mutex> lock(r.mutex);
  ownedHere(r, /*start=*/true);
  r.queue.push_back(std::move(read));
  r.work.notify_one();
}

void awaitHelperRead(const HelperRead& read) {
  Reader& r = reader();
  std::unique_lock<std::mutex> lock(r.mutex);
  ownedHere(r, /*start=*/false);
  r.done.wait(lock, [&read] { return read.released; });
}

}  // namespace hvd::transport::shm
