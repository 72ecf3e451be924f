#include "runtime/device_held_op.h"

namespace hvd::runtime {

using common::Status;

namespace {

coord::Key firstKey(const coord::Response& r) {
  return r.keys.empty() ? coord::Key() : r.keys[0];
}

}  // namespace

Status DeviceHeldOp::check(const OpContext& op, bool* held, bool* landed) {
  const coord::Response& r = op.response;
  if (held_ && (first_ != firstKey(r) || process_set_ != r.process_set)) release();
  *held = held_;
  if (!held_) return Status::ok();
  bool finished = false;
  HVD_RETURN_IF_ERROR(stream_->query(event_, &finished));
  *landed = finished;
  return Status::ok();
}

Status DeviceHeldOp::hold(const OpContext& op, transport::nccl::DeviceStream& stream,
                          transport::nccl::CudaEvent event, uint8_t* host, size_t out_offset) {
  const coord::Response& r = op.response;
  host_ = host;
  out_offset_ = out_offset;
  first_ = firstKey(r);
  process_set_ = r.process_set;
  since_ = std::chrono::steady_clock::now();
  stream_ = &stream;
  event_ = event;
  held_ = true;
  return wake_.notifyAfter(stream);
}

Status DeviceHeldOp::take(uint8_t** in, uint8_t** out) {
  if (!held_) {
    return common::internalError("a staged CUDA op ran before its inputs reached the host");
  }
  *in = host_;
  *out = host_ + out_offset_;
  release();
  return Status::ok();
}

void DeviceHeldOp::release() {
  if (!held_) return;
  stream_->release(event_);
  held_ = false;
  stream_ = nullptr;
  event_ = nullptr;
  host_ = nullptr;
}

bool DeviceHeldOp::overdue(std::chrono::steady_clock::time_point now,
                           double timeout_seconds) const {
  return held_ && now - since_ > std::chrono::duration<double>(timeout_seconds);
}

}  // namespace hvd::runtime
