#include "transport/shm/host_agreement.h"

#include <string>

#include "common/byte_codec.h"

namespace hvd::transport::shm {

namespace {

constexpr size_t kVerdictBytes = 16;

common::Status writeVerdict(int fd, const ProbeVerdict& verdict, tcp::Deadline deadline) {
  std::string msg;
  common::ByteWriter w(&msg);
  w.u32(verdict.refusal);
  w.i32(verdict.rank);
  w.i32(verdict.peer);
  w.u32(0);
  return tcp::writeFull(fd, msg.data(), msg.size(), deadline);
}

common::Status readVerdict(int fd, tcp::Deadline deadline, ProbeVerdict* verdict) {
  uint8_t raw[kVerdictBytes];
  HVD_RETURN_IF_ERROR(tcp::readFull(fd, raw, sizeof(raw), deadline));
  common::ByteReader in(raw, sizeof(raw));
  if (!in.u32(&verdict->refusal) || !in.i32(&verdict->rank) || !in.i32(&verdict->peer) ||
      !in.skip(4)) {
    return common::internalError("malformed probe verdict: " + in.error());
  }
  return common::Status::ok();
}

}  // namespace

common::Status hostIndexOf(const std::vector<int>& host_ranks, int rank, int local_size,
                           const char* probe, int* self) {
  *self = -1;
  for (size_t i = 0; i < host_ranks.size(); ++i) {
    if (host_ranks[i] == rank) *self = static_cast<int>(i);
  }
  if (*self < 0 || static_cast<int>(host_ranks.size()) != local_size) {
    return common::internalError(std::string(probe) + " probe: rank " + std::to_string(rank) +
                                 " is not among its host's ranks");
  }
  return common::Status::ok();
}

common::Status hostBarrier(const std::vector<int>& host_ranks, const std::vector<int>& fds,
                           int self, tcp::Deadline deadline) {
  const int n = static_cast<int>(host_ranks.size());
  uint8_t byte = 1;
  if (self == 0) {
    for (int i = 1; i < n; ++i) {
      HVD_RETURN_IF_ERROR(tcp::readFull(fds[host_ranks[i]], &byte, 1, deadline));
    }
    for (int i = 1; i < n; ++i) {
      HVD_RETURN_IF_ERROR(tcp::writeFull(fds[host_ranks[i]], &byte, 1, deadline));
    }
    return common::Status::ok();
  }
  const int leader_fd = fds[host_ranks[0]];
  HVD_RETURN_IF_ERROR(tcp::writeFull(leader_fd, &byte, 1, deadline));
  return tcp::readFull(leader_fd, &byte, 1, deadline);
}

common::Status agreeOnVerdict(const std::vector<int>& host_ranks, const std::vector<int>& fds,
                              int self, const ProbeVerdict& mine, ProbeVerdict* host,
                              tcp::Deadline deadline) {
  const int n = static_cast<int>(host_ranks.size());
  *host = mine;
  if (self == 0) {
    for (int i = 1; i < n; ++i) {
      ProbeVerdict theirs;
      HVD_RETURN_IF_ERROR(readVerdict(fds[host_ranks[i]], deadline, &theirs));
      if (host->refusal == 0 && theirs.refusal != 0) *host = theirs;
    }
    for (int i = 1; i < n; ++i) {
      HVD_RETURN_IF_ERROR(writeVerdict(fds[host_ranks[i]], *host, deadline));
    }
    return common::Status::ok();
  }
  const int leader_fd = fds[host_ranks[0]];
  HVD_RETURN_IF_ERROR(writeVerdict(leader_fd, mine, deadline));
  return readVerdict(leader_fd, deadline, host);
}

}  // namespace hvd::transport::shm
