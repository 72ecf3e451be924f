// The negotiation half of BackgroundLoop: control messages between workers and rank 0, the
// coordinator step (with the timeline's NEGOTIATE_<OP> spans, the batching window and the
// autotune switch) and the stall inspector. See background_loop.h; the shutdown agreement is
// in shutdown_agreement.cc.
#include <algorithm>

#include "common/logging.h"
#include "coord/fusion.h"
#include "runtime/background_loop.h"

namespace hvd::runtime {

using common::Status;
using coord::MessageType;
using Clock = std::chrono::steady_clock;

namespace {

// A kAbort payload is the failing rank's status code (one byte) followed by its message
// (Note [Failure fan-out]); anything else reads as a plain abort. A peer's own mistake (a
// ValueError there) is an abort here: this rank did nothing wrong.
Status statusFromAbort(const std::string& payload) {
  if (!payload.empty()) {
    auto code = static_cast<common::Code>(static_cast<unsigned char>(payload[0]));
    if (code == common::Code::kPeerLost || code == common::Code::kTimeout ||
        code == common::Code::kAborted || code == common::Code::kInternal) {
      return Status(code, payload.substr(1));
    }
    if (code == common::Code::kInvalidArgument || code == common::Code::kTypeError ||
        code == common::Code::kMismatch) {
      return common::aborted(payload.substr(1));
    }
  }
  return common::aborted(payload);
}

}  // namespace

void BackgroundLoop::readControl() {
  for (int r = 0; r < mesh_.size() && !failed_ && !finished_; ++r) {
    transport::ControlChannel* channel = mesh_.control(r);
    if (channel == nullptr) continue;
    channel->flush();  // Note [Control over shm] C
    std::vector<transport::ControlMessage> messages;
    Status status = channel->receive(&messages);
    for (const auto& m : messages) {
      if (mesh_.rank() == 0) handleWorkerMessage(r, m); else handleCoordinatorMessage(m);
      if (failed_ || finished_) return;
    }
    if (status.isOk()) continue;
    if (shutdown_sent_) {
      // A peer that already agreed to shut down may close first.
      if (mesh_.rank() == 0) coordinator_->noteShutdown(r); else finished_ = true;
      continue;
    }
    if (status.code() == common::Code::kPeerLost) {
      fail(common::peerLost("lost connection to rank " + std::to_string(r) +
                            ": the process exited or closed the connection"), true);
    } else {
      fail(status, true);
    }
  }
}

void BackgroundLoop::handleCoordinatorMessage(const transport::ControlMessage& message) {
  switch (static_cast<MessageType>(message.type)) {
    case MessageType::kResponses: {
      coord::ResponseList list;
      Status status = coord::decode(message.payload, keys_, &list);
      if (!status.isOk()) {
        fail(common::internalError("malformed response list from rank 0: " + status.message()),
             false);
        return;
      }
      // The switch precedes this list's responses (Rule in coord/message.h, ParamsUpdate).
      if (list.params) to_execute_.push_back(Work{list.params, coord::Response()});
      for (auto& r : list.responses) to_execute_.push_back(Work{std::nullopt, std::move(r)});
      break;
    }
    case MessageType::kShutdown:  // every rank agreed (checkShutdownAgreement)
      finished_ = true;
      break;
    case MessageType::kAbort:
      fail(statusFromAbort(message.payload), false);
      break;
    default:
      HVD_LOG(kWarning, "coord") << "ignoring control message of unknown type " << message.type;
  }
}

// Requests are admitted as they are decoded: a repeated one comes from the mirror with its
// key hint, so the steady state interns nothing.
void BackgroundLoop::handleWorkerMessage(int from, const transport::ControlMessage& message) {
  switch (static_cast<MessageType>(message.type)) {
    case MessageType::kRequests: {
      timeline::Timeline* timeline = negotiationTimeline();
      timeline::ClockScope one_clock_read(timeline);  // these arrivals are processed together
      const auto now = Clock::now();
      Status status = coordinator_->admitRequests(from, message.payload, timeline, now);
      if (!status.isOk()) {
        fail(common::internalError("malformed request list from rank " + std::to_string(from) +
                                   ": " + status.message()), true);
        return;
      }
      break;
    }
    case MessageType::kShutdown:
      coordinator_->noteShutdown(from);
      break;
    case MessageType::kAbort:
      fail(statusFromAbort(message.payload), /*tell_peers=*/true);
      break;
    default:
      HVD_LOG(kWarning, "coord") << "ignoring control message of unknown type " << message.type
                                 << " from rank " << from;
  }
}

// The coordinator step, in order (requests were admitted as they arrived: drain and
// readControl call RankZeroCoordinator::admit(); only those for sets not registered yet wait
// in its parked list):
//   a. admit parked requests whose set is registered now;
//   b. (at the start of the pass, before any admission: a new autotune setting — rank 0's
//      fusion threshold, window and cache — is adopted, so the responses released in this
//      pass are fused under it and carry it);
//   c. release what is ready (timeline: NEGOTIATE_<OP> closes) into the batching window;
//   d. keep holding while the batching window is open (BatchingWindow::hold), else send the
//      batch.
void BackgroundLoop::coordinate() {
  auto t0 = Clock::now();
  timeline::Timeline* timeline = negotiationTimeline();
  coordinator_->admitParked(timeline);
  coordinator_->release(t0, timeline);
  if (coordinator_->sendNow()) sendReady();
  metrics_.addNegotiate(std::chrono::duration<double>(Clock::now() - t0).count());
}

// Step A: send each worker its share (responses of sets it belongs to), in order, with the
// pending autotune setting (also to workers whose share is empty). Step B: queue rank 0's own
// share the same way.
void BackgroundLoop::sendReady() {
  std::optional<coord::ParamsUpdate> params;
  std::vector<coord::Response> ready = coordinator_->takeBatch(&params);
  std::vector<const coord::Response*> share;
  for (int w = 1; w < mesh_.size(); ++w) {
    share.clear();
    for (const auto& r : ready) {
      if (sets_.contains(r.process_set, w)) share.push_back(&r);
    }
    if (share.empty() && !params) continue;
    Status status = mesh_.control(w)->send(static_cast<uint32_t>(MessageType::kResponses),
                                           coord::encode(share.data(), share.size(), params,
                                                         keys_),
                                           config_.timeout_seconds);
    if (!status.isOk()) {
      fail(common::peerLost("lost connection to rank " + std::to_string(w) + ": " +
                            status.message()), true);
      return;
    }
  }
  if (params) to_execute_.push_back(Work{params, coord::Response()});
  for (auto& r : ready) to_execute_.push_back(Work{std::nullopt, std::move(r)});
}

// ---- autotune --------------------------------------------------------------------------------

void BackgroundLoop::applyParams(const coord::ParamsUpdate& update) {
  if (autotuner_ != nullptr) autotuner_->applied(update, global_responses_);
  // The only setting that acts on every rank; fusion, window and cache act on rank 0 alone,
  // which adopted them when it attached this update (RankZeroCoordinator::adoptTunedParams).
  executor_.setHierarchicalAllreduce(update.hierarchical_allreduce);
}

// Rank 0 scores settings by the global set's allreduce bytes per second (Horovod's score).
void BackgroundLoop::observeExecuted(const coord::Response& r, const Status& status) {
  if (autotuner_ == nullptr || !coordinator_ || !autotuner_->observing() || !status.isOk() ||
      r.process_set != 0 || r.type != coord::OpType::kAllreduce ||
      r.status != coord::ResponseType::kOk) {
    return;
  }
  const int64_t element = static_cast<int64_t>(common::dataTypeSize(r.dtype));
  for (size_t i = 0; i < r.keys.size(); ++i) {
    autotuner_->observe(keys_.name(r.keys[i]), i < r.counts.size() ? r.counts[i] * element : 0);
  }
}

void BackgroundLoop::sendRequests() {
  if (outgoing_.empty()) return;
  encoding_.clear();
  for (coord::Key key : outgoing_) {
    const TensorEntry* entry = entries_.find(key);
    if (entry != nullptr) encoding_.push_back(&entry->request);
  }
  outgoing_.clear();
  std::string bytes = coord::encodeRequests(encoding_.data(), encoding_.size(),
                                           request_cache_.get(), &keys_);
  Status status = mesh_.control(0)->send(static_cast<uint32_t>(MessageType::kRequests), bytes,
                                         config_.timeout_seconds);
  if (!status.isOk()) {
    fail(common::peerLost("lost connection to rank 0: " + status.message()), true);
  }
}

void BackgroundLoop::inspectStalls() {
  auto now = Clock::now();
  if (now - last_stall_check_ < std::chrono::milliseconds(200)) return;
  std::vector<PendingInfo> pending;
  entries_.forEach([&](const TensorEntry& entry) {
    PendingInfo info;
    info.name = keys_.name(entry.request.key);
    info.op = coord::opTypeName(entry.request.type);
    info.age_seconds = std::chrono::duration<double>(now - entry.enqueued).count();
    if (coordinator_) info.missing_ranks = coordinator_->missingRanks(entry.request.key);
    pending.push_back(std::move(info));
  });
  metrics_.setPending(std::move(pending));
  if (coordinator_) failDeadlocked(now);
  if (!coordinator_ || config_.stall_check_disable) {
    last_stall_check_ = now;
    return;
  }
  auto period = std::chrono::duration<double>(config_.stall_check_seconds);
  if (now - last_stall_report_ >= period) {
    last_stall_report_ = now;
    std::string report = coordinator_->stallReport(
        std::chrono::seconds(static_cast<int64_t>(config_.stall_check_seconds)));
    if (!report.empty()) HVD_LOG(kWarning, "stall") << report;
  }
  last_stall_check_ = now;
}

// Note [Deadlock shutdown] in coord/deadlock.cc: the error Responses leave with the next
// coordinate(), on every member of their sets.
void BackgroundLoop::failDeadlocked(Clock::time_point now) {
  constexpr double kStallShutdownChecks = 4;  // the default: this many stall warning periods
  double seconds = config_.stall_shutdown_seconds;
  if (seconds < 0) seconds = kStallShutdownChecks * config_.stall_check_seconds;
  if (seconds == 0) return;
  const std::string report =
      coordinator_->failDeadlocked(now, std::chrono::duration<double>(seconds));
  if (report.empty()) return;
  HVD_LOG(kError, "stall") << report;
  queue_.wakeIfAsleep();
}

}  // namespace hvd::runtime
