#include "algo/host_layout.h"

#include <algorithm>
#include <string>

#include "algo/algorithms.h"
#include "algo/ring_util.h"
#include "transport/mesh.h"
#include "transport/shm/collective_sync.h"

namespace hvd::algo {

HostLayout layoutOf(const transport::Comm& comm) {
  HostLayout layout;
  std::vector<std::string> ids;
  const transport::Mesh& mesh = comm.mesh();
  for (int s = 0; s < comm.size(); ++s) {
    const int g = comm.globalRank(s);
    const std::string& id = mesh.peerInfo(g).host_id;
    const size_t h = std::find(ids.begin(), ids.end(), id) - ids.begin();
    if (h == ids.size()) {
      ids.push_back(id);
      layout.hosts.emplace_back();
    }
    layout.hosts[h].push_back(g);
  }
  for (size_t h = 0; h < layout.hosts.size(); ++h) {
    std::vector<int>& members = layout.hosts[h];
    std::sort(members.begin(), members.end());
    layout.even = layout.even && members.size() == layout.hosts[0].size();
    const auto it = std::find(members.begin(), members.end(), mesh.rank());
    if (it != members.end()) {
      layout.my_host = static_cast<int>(h);
      layout.my_local = static_cast<int>(it - members.begin());
    }
  }
  return layout;
}

transport::Comm subComm(const transport::Comm& comm, std::vector<int> members) {
  return transport::Comm(comm.mesh(), std::move(members), comm.timeoutSeconds(),
                         comm.spinMicroseconds());
}

common::Status hostBlocksReduceScatter(transport::Comm& local, void* data, size_t count,
                                       common::DataType dtype, common::ReduceOp op,
                                       size_t segment_bytes) {
  if (transport::shm::CollectiveSync::segmentFor(local) != nullptr) {
    return hostReduceScatter(local, data, count, dtype, op);
  }
  return ringReduceScatterInPlace(local, data, evenBlocks(count, local.size()), dtype, op,
                                  segment_bytes);
}

common::Status hostBlocksAllgather(transport::Comm& local, void* data, size_t count,
                                   common::DataType dtype) {
  if (transport::shm::CollectiveSync::segmentFor(local) != nullptr) {
    return hostAllgather(local, data, count, dtype);
  }
  const BlockOffsets blocks = evenBlocks(count, local.size());
  const size_t esize = common::dataTypeSize(dtype);
  BlockOffsets bytes(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) bytes[i] = blocks[i] * esize;
  return ringAllgatherInPlace(local, data, bytes);
}

}  // namespace hvd::algo
