#include "runtime/device_loop_wake.h"

#include <unistd.h>

#include <cstdint>

namespace hvd::runtime {

// The host function may run after the loop is gone (a shutdown while the stream drains): it
// holds its own reference to a duplicate of the fd.
class HostWake {
 public:
  explicit HostWake(int fd) : fd_(::dup(fd)) {}
  ~HostWake() {
    if (fd_ >= 0) ::close(fd_);
  }
  HostWake(const HostWake&) = delete;
  HostWake& operator=(const HostWake&) = delete;
  void wake() const {
    const uint64_t one = 1;
    ssize_t rc = ::write(fd_, &one, sizeof(one));
    (void)rc;  // EAGAIN: the counter is already non-zero, the loop wakes anyway
  }

 private:
  int fd_;
};

namespace {

void wakeFromDriver(void* data) {
  auto* keep = static_cast<std::shared_ptr<HostWake>*>(data);
  (*keep)->wake();
  delete keep;
}

}  // namespace

LoopWake::LoopWake(int wake_fd) : wake_(std::make_shared<HostWake>(wake_fd)) {}

common::Status LoopWake::notifyAfter(transport::nccl::DeviceStream& stream) {
  auto* keep = new std::shared_ptr<HostWake>(wake_);
  common::Status status = stream.notify(&wakeFromDriver, keep);
  if (!status.isOk()) delete keep;
  return status;
}

}  // namespace hvd::runtime
