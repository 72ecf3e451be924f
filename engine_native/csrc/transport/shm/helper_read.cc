// The process's reading thread (transport/shm/helper_read.h).
#include "transport/shm/helper_read.h"

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "common/test_switch.h"
#include "transport/shm/cross_memory.h"

namespace hvd::transport::shm {

namespace {

// Note [Helper reads across fork]
// A forked child has the parent's Reader but not its thread, and the Reader's condition
// variables may still count that thread as a waiter: glibc's notify then waits, in the child,
// for a thread that does not exist (a child's second read hung for ever, holding the lock and
// its caller's progress). A mutex that another thread held at fork() also stays locked in the
// child for good. So the process takes the Reader's mutex across fork() (pthread_atfork,
// registered when the core is loaded: no read is half queued, half finished or half released
// then; a read's result is written under the mutex), and the child replaces the Reader. The
// parent's reads end in the old one (failed, unless the thread had finished one); only the
// forking thread exists in the child, so nothing else touches them. The old Reader is left
// behind as it is, its mutex held, and the child's first read starts a thread of its own.
struct Reader {
  std::mutex mutex;
  std::condition_variable work;  // a read was queued
  std::condition_variable done;  // a read was released
  std::deque<std::shared_ptr<HelperRead>> queue;
  std::shared_ptr<HelperRead> current;  // the read the thread runs
  bool serving = false;  // the reading thread was started (at the first read)
};

std::atomic<Reader*> g_reader{nullptr};  // never destroyed: its thread waits on it until exit
std::atomic<uint64_t> g_reads{0};

void lockForFork() { g_reader.load()->mutex.lock(); }
void unlockInParent() { g_reader.load()->mutex.unlock(); }

void replaceInChild() {
  Reader* old = g_reader.load();
  if (old->current != nullptr) old->queue.push_back(std::move(old->current));
  for (const std::shared_ptr<HelperRead>& read : old->queue) {
    if (!read->finished.load(std::memory_order_relaxed)) {
      read->status = common::internalError("a helper read of the process this one forked from");
      read->os_error = 0;  // (not a lost peer)
      read->finished.store(true, std::memory_order_seq_cst);
    }
    read->released = true;
  }
  old->queue.clear();
  g_reader.store(new Reader());
}

// At load, before any thread of the core exists: a fork while a first use still set the
// Reader up would leave the child a set-up that never ends.
const bool g_fork_handlers = [] {
  g_reader.store(new Reader());
  return ::pthread_atfork(lockForFork, unlockInParent, replaceInChild) == 0;
}();

Reader& reader() { return *g_reader.load(); }

void serve(Reader* r) {
  std::unique_lock<std::mutex> lock(r->mutex);
  while (true) {
    r->work.wait(lock, [r] { return !r->queue.empty(); });
    std::shared_ptr<HelperRead> read = std::move(r->queue.front());
    r->queue.pop_front();
    r->current = read;
    lock.unlock();
    // Test switch: each read starts this late (point-to-point: a receive that ends while it
    // runs, the wake).
    if (const char* ms = HVD_TEST_SWITCH("HELPER_READ_DELAY_MS")) {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::atol(ms)));
    }
    int os_error = 0;
    common::Status status = readPeer(read->pid, read->remote, read->local, read->bytes,
                                     &os_error);
    g_reads.fetch_add(1, std::memory_order_relaxed);
    lock.lock();  // (a fork finds the result whole or not at all)
    read->status = std::move(status);
    read->os_error = os_error;
    read->finished.store(true, std::memory_order_seq_cst);
    lock.unlock();
    if (read->on_finished != nullptr) read->on_finished(read->context);
    lock.lock();
    read->released = true;
    r->current = nullptr;
    r->done.notify_all();
  }
}

}  // namespace

void startHelperRead(std::shared_ptr<HelperRead> read) {
  Reader& r = reader();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (!r.serving) {
    try {
      std::thread(serve, &r).detach();
      r.serving = true;
    } catch (const std::system_error& e) {  // no thread: this read fails (the next tries again)
      read->status = common::internalError(std::string("could not start the helper reading "
                                                       "thread: ") + e.what());
      read->finished.store(true, std::memory_order_seq_cst);
      read->released = true;
      return;
    }
  }
  r.queue.push_back(std::move(read));
  r.work.notify_one();
}

void awaitHelperRead(const HelperRead& read) {
  Reader& r = reader();
  std::unique_lock<std::mutex> lock(r.mutex);
  r.done.wait(lock, [&read] { return read.released; });
}

common::Status readOnTwoThreads(pid_t pid, uint64_t remote, void* local, size_t bytes) {
  const size_t half = pageHalf(bytes);
  auto second = std::make_shared<HelperRead>();
  second->pid = pid;
  second->remote = remote + half;
  second->local = static_cast<uint8_t*>(local) + half;
  second->bytes = bytes - half;
  startHelperRead(second);
  common::Status first = readPeer(pid, remote, local, half);
  awaitHelperRead(*second);  // (also after a failure here: nothing may write `local` later)
  return first.isOk() ? second->status : first;
}

uint64_t helperReads() { return g_reads.load(std::memory_order_relaxed); }

}  // namespace hvd::transport::shm
