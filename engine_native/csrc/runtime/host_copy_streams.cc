// Per-device host-copy streams (runtime/host_copy_streams.h).
#include "runtime/host_copy_streams.h"

#include <utility>

namespace hvd::runtime {

using common::Status;
namespace nccl = transport::nccl;

Status HostCopyStreams::get(int device, nccl::DeviceStream** out) {
  auto& stream = streams_[device];
  if (!stream) {
    auto made = std::make_unique<nccl::DeviceStream>();
    HVD_RETURN_IF_ERROR(made->init(device));
    stream = std::move(made);
  }
  HVD_RETURN_IF_ERROR(stream->select());
  *out = stream.get();
  return Status::ok();
}

void HostCopyStreams::drain(std::chrono::steady_clock::time_point deadline) {
  nccl::DeviceRestorer restore;
  for (auto& [device, stream] : streams_) {
    if (stream->select().isOk()) stream->drain(deadline);
  }
}

}  // namespace hvd::runtime
