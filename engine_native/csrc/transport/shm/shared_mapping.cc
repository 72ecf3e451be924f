// A named POSIX shared-memory object, mapped (transport/shm/shared_mapping.h).
#include "transport/shm/shared_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/check.h"

namespace hvd::transport::shm {

using common::Status;

namespace {

Status callFailed(const char* call, const std::string& name, int err) {
  return common::internalError(std::string(call) + "(" + name + "): " + std::strerror(err));
}

}  // namespace

Status SharedMapping::create(const std::string& name, uint64_t bytes, SharedMapping* out) {
  HVD_CHECK(out->base_ == nullptr && !out->linked_);
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return callFailed("shm_open", name, errno);
  out->name_ = name;
  out->linked_ = true;  // from here the destructor removes the name, whatever fails next
  const char* call = "ftruncate";
  int err = ::ftruncate(fd, static_cast<off_t>(bytes)) == 0 ? 0 : errno;
  if (err == 0) {
    call = "posix_fallocate";
    err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));  // returns the error
  }
  if (err != 0) {
    ::close(fd);
    return common::internalError("cannot allocate " + std::to_string(bytes) +
                                 " bytes of shared memory for " + name + ": " + call + ": " +
                                 std::strerror(err));
  }
  return out->map(fd, bytes);
}

Status SharedMapping::open(const std::string& name, uint64_t bytes, SharedMapping* out) {
  HVD_CHECK(out->base_ == nullptr && !out->linked_);
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return callFailed("shm_open", name, errno);
  out->name_ = name;
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return callFailed("fstat", name, err);
  }
  if (static_cast<uint64_t>(st.st_size) != bytes) {
    ::close(fd);
    return common::internalError("shared memory " + name + " has an unexpected size: " +
                                 std::to_string(st.st_size) + " bytes, expected " +
                                 std::to_string(bytes));
  }
  return out->map(fd, bytes);
}

Status SharedMapping::map(int fd, uint64_t bytes) {
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (base == MAP_FAILED) {
    return common::internalError("mmap(" + name_ + ", " + std::to_string(bytes) +
                                 " bytes): " + std::strerror(err));
  }
  base_ = static_cast<uint8_t*>(base);
  bytes_ = bytes;
  return Status::ok();
}

SharedMapping::~SharedMapping() {
  unlink();
  if (base_ != nullptr) ::munmap(base_, bytes_);
}

void SharedMapping::unlink() {
  if (linked_) ::shm_unlink(name_.c_str());
  linked_ = false;
}

}  // namespace hvd::transport::shm
