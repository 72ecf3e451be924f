// ShmPair (transport/shm/pair.h). A dead peer is not seen here (shared memory has no hang-up);
// Comm finds it through Mesh::findLostPeer on the pair's TCP socket, which stays open.
#include "transport/shm/pair.h"

namespace hvd::transport::shm {

using common::Status;

Status ShmPair::sendSome(const uint8_t* data, size_t n, size_t* moved) {
  *moved = n == 0 ? 0 : link_.outgoing.write(data, n);
  if (*moved > 0) link_.wakePeer();  // data for the receiver
  return Status::ok();
}

Status ShmPair::recvSome(uint8_t* data, size_t n, size_t* moved) {
  *moved = n == 0 ? 0 : link_.incoming.read(data, n);
  if (*moved > 0) link_.wakePeer();  // space for the sender
  return Status::ok();
}

}  // namespace hvd::transport::shm
