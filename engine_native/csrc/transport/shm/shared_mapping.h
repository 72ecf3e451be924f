// SharedMapping: one named POSIX shared-memory object mapped into this process, the one
// create/open/map/unmap under every shm segment (Segment, CollectiveSegment). The owner
// creates it; peers open it by the name the owner sent them over an authenticated socket.
// Owned by its segment; called on the bootstrap thread during Mesh::connect, destroyed with
// the Mesh.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace hvd::transport::shm {

class SharedMapping {
 public:
  SharedMapping() = default;
  ~SharedMapping();
  SharedMapping(const SharedMapping&) = delete;
  SharedMapping& operator=(const SharedMapping&) = delete;

  // Creates `name` (O_EXCL, mode 0600), sizes it to `bytes` with fallocate (so a full
  // /dev/shm fails here, not with SIGBUS on a later write) and maps it zero-filled. *out must
  // be empty. Errors name the object and the failed call with its errno text.
  static common::Status create(const std::string& name, uint64_t bytes, SharedMapping* out);
  // Opens an existing `name` and maps it after checking it is exactly `bytes` long, so a peer
  // never touches memory past what it sized its own view for.
  static common::Status open(const std::string& name, uint64_t bytes, SharedMapping* out);

  // Removes the name (mappings stay); idempotent, and a no-op for a mapping this process
  // opened. The destructor unlinks too, then unmaps.
  void unlink();
  const std::string& name() const { return name_; }
  uint8_t* base() const { return base_; }
  size_t bytes() const { return bytes_; }

 private:
  common::Status map(int fd, uint64_t bytes);  // maps and closes fd

  std::string name_;
  uint8_t* base_ = nullptr;
  size_t bytes_ = 0;
  bool linked_ = false;  // this process created the name and has not unlinked it yet
};

}  // namespace hvd::transport::shm
