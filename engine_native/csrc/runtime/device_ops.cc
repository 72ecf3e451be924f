#include "runtime/device_ops.h"

#include <memory>

#include "runtime/device_output_pool.h"

namespace hvd::runtime {

using common::Status;

Status DeviceOps::inputsReady(OpContext&, DeviceStream&, bool* ready) {
  *ready = true;
  return Status::ok();
}

Status resultTarget(const OpContext& op, transport::nccl::DeviceStream& stream, size_t bytes,
                    ResultTarget* target) {
  target->lone = op.response.keys.size() == 1 && op.entries[0] != nullptr;
  if (target->lone) {
    target->data = static_cast<uint8_t*>(op.entries[0]->output);
    return Status::ok();
  }
  void* buffer = nullptr;
  HVD_RETURN_IF_ERROR(stream.deviceBuffer(bytes, &buffer));
  target->data = static_cast<uint8_t*>(buffer);
  return Status::ok();
}

Status deviceOutput(transport::nccl::DeviceStream& stream, size_t bytes, OpResult* result) {
  void* data = nullptr;
  size_t capacity = 0;
  if (bytes > 0) {
    HVD_RETURN_IF_ERROR(DeviceOutputPool::instance().take(bytes, stream, &data, &capacity));
  }
  result->buffer = pooledDeviceOutput(data, bytes, stream.device(), capacity);
  return Status::ok();
}

Status packInputs(const OpContext& op, transport::nccl::DeviceStream& stream, uint8_t* base,
                  bool zero_missing) {
  const coord::Response& r = op.response;
  const size_t elem = common::dataTypeSize(r.dtype);
  size_t offset = 0;
  for (size_t i = 0; i < r.keys.size(); ++i) {
    const size_t n = static_cast<size_t>(r.counts[i]) * elem;
    if (op.entries[i] != nullptr) {
      HVD_RETURN_IF_ERROR(stream.copy(base + offset, op.entries[i]->input, n));
    } else if (zero_missing) {
      HVD_RETURN_IF_ERROR(stream.zero(base + offset, n));
    }
    offset += n;
  }
  return Status::ok();
}

Status unpackOutputs(const OpContext& op, transport::nccl::DeviceStream& stream,
                     const uint8_t* base) {
  const coord::Response& r = op.response;
  const size_t elem = common::dataTypeSize(r.dtype);
  size_t offset = 0;
  for (size_t i = 0; i < r.keys.size(); ++i) {
    const size_t n = static_cast<size_t>(r.counts[i]) * elem;
    if (op.entries[i] != nullptr) {
      HVD_RETURN_IF_ERROR(stream.copy(op.entries[i]->output, base + offset, n));
    }
    offset += n;
  }
  return Status::ok();
}

}  // namespace hvd::runtime
