// The negotiation half of BackgroundLoop: control messages between workers and rank 0, the
// coordinator step, the shutdown agreement and the stall inspector. See background_loop.h.
#include <algorithm>

#include "common/logging.h"
#include "runtime/background_loop.h"

namespace hvd::runtime {

using common::Status;
using coord::MessageType;
using Clock = std::chrono::steady_clock;

namespace {

const char* kShutdownMessage =
    "Horovod has been shut down. This was caused by an exception on one of the ranks or an "
    "attempt to allreduce, allgather or broadcast a tensor after one of the ranks finished "
    "execution. If the shutdown was caused by an exception, you should see the exception in "
    "the log before the first shutdown message.";

}  // namespace

void BackgroundLoop::readControl() {
  for (int r = 0; r < mesh_.size() && !failed_ && !finished_; ++r) {
    transport::ControlChannel* channel = mesh_.control(r);
    if (channel == nullptr) continue;
    std::vector<transport::ControlMessage> messages;
    Status status = channel->receive(&messages);
    for (const auto& m : messages) {
      if (mesh_.rank() == 0) handleWorkerMessage(r, m); else handleCoordinatorMessage(m);
      if (failed_ || finished_) return;
    }
    if (status.isOk()) continue;
    if (shutdown_sent_) {
      // A peer that already agreed to shut down may close first.
      if (mesh_.rank() == 0) shutdown_ranks_.insert(r); else finished_ = true;
      continue;
    }
    if (status.code() == common::Code::kPeerLost) {
      fail(common::peerLost("lost connection to rank " + std::to_string(r) +
                            ": the process exited or closed the connection"), false);
    } else {
      fail(status, false);
    }
  }
}

void BackgroundLoop::handleCoordinatorMessage(const transport::ControlMessage& message) {
  switch (static_cast<MessageType>(message.type)) {
    case MessageType::kResponses: {
      coord::ResponseList list;
      Status status = coord::decode(message.payload, &list);
      if (!status.isOk()) {
        fail(common::internalError("malformed response list from rank 0: " + status.message()),
             false);
        return;
      }
      for (auto& r : list.responses) to_execute_.push_back(std::move(r));
      break;
    }
    case MessageType::kShutdown:
      finished_ = true;
      break;
    case MessageType::kAbort:
      fail(common::aborted(message.payload), false);
      break;
    default:
      HVD_LOG(kWarning, "coord") << "ignoring control message of unknown type " << message.type;
  }
}

void BackgroundLoop::handleWorkerMessage(int from, const transport::ControlMessage& message) {
  switch (static_cast<MessageType>(message.type)) {
    case MessageType::kRequests: {
      coord::RequestList list;
      Status status = coord::decodeRequests(message.payload, mirrors_[from].get(), &list);
      if (!status.isOk()) {
        fail(common::internalError("malformed request list from rank " + std::to_string(from) +
                                   ": " + status.message()), true);
        return;
      }
      for (auto& request : list.requests) {
        request.request_rank = from;
        parked_.push_back(std::move(request));
      }
      break;
    }
    case MessageType::kShutdown:
      shutdown_ranks_.insert(from);
      break;
    case MessageType::kAbort:
      fail(common::aborted(message.payload), /*tell_peers=*/true);
      break;
    default:
      HVD_LOG(kWarning, "coord") << "ignoring control message of unknown type " << message.type
                                 << " from rank " << from;
  }
}

void BackgroundLoop::syncProcessSets() {
  uint64_t version = sets_.version();
  if (version == sets_version_) return;
  sets_version_ = version;
  auto snapshot = sets_.snapshot();
  for (auto it = registered_sets_.begin(); it != registered_sets_.end();) {
    if (snapshot.count(*it) == 0) {
      coordinator_->removeProcessSet(*it);
      it = registered_sets_.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& [id, members] : snapshot) {
    if (registered_sets_.insert(id).second) coordinator_->addProcessSet({id, members});
  }
}

void BackgroundLoop::coordinate() {
  syncProcessSets();
  auto t0 = Clock::now();
  std::vector<coord::Request> still_parked;
  for (auto& request : parked_) {
    // A worker may register a new set (and use it) a moment before rank 0 does: keep its
    // requests until rank 0's own add_process_set lands.
    if (registered_sets_.count(request.process_set) == 0) {
      still_parked.push_back(std::move(request));
      continue;
    }
    Status status = coordinator_->add(request);
    if (!status.isOk()) {
      HVD_LOG(kWarning, "coord") << "rejected request '" << request.name << "' from rank "
                                 << request.request_rank << ": " << status.message();
    }
  }
  parked_.swap(still_parked);
  std::vector<coord::Response> ready = coordinator_->takeReady();
  if (ready.empty()) return;
  // Step A: send each worker its share (responses of sets it belongs to), in order.
  for (int w = 1; w < mesh_.size(); ++w) {
    coord::ResponseList list;
    for (const auto& r : ready) {
      auto members = sets_.members(r.process_set);
      if (members && std::find(members->begin(), members->end(), w) != members->end()) {
        list.responses.push_back(r);
      }
    }
    if (list.responses.empty()) continue;
    Status status = mesh_.control(w)->send(static_cast<uint32_t>(MessageType::kResponses),
                                           coord::encode(list), config_.timeout_seconds);
    if (!status.isOk()) {
      fail(common::peerLost("lost connection to rank " + std::to_string(w) + ": " +
                            status.message()), false);
      return;
    }
  }
  // Step B: execute rank 0's own share in the same order.
  for (auto& r : ready) to_execute_.push_back(std::move(r));
  metrics_.addNegotiate(std::chrono::duration<double>(Clock::now() - t0).count());
}

void BackgroundLoop::sendRequests() {
  if (outgoing_.empty()) return;
  coord::RequestList list;
  list.requests.swap(outgoing_);
  for (auto& r : list.requests) r.request_rank = mesh_.rank();
  std::string bytes = coord::encodeRequests(list, request_cache_.get());
  Status status = mesh_.control(0)->send(static_cast<uint32_t>(MessageType::kRequests), bytes,
                                         config_.timeout_seconds);
  if (!status.isOk()) {
    fail(common::peerLost("lost connection to rank 0: " + status.message()), false);
  }
}

void BackgroundLoop::inspectStalls() {
  auto now = Clock::now();
  if (now - last_stall_check_ < std::chrono::milliseconds(200)) return;
  std::vector<PendingInfo> pending;
  for (const auto& [key, entry] : entries_) {
    PendingInfo info;
    info.name = key.second;
    info.op = coord::opTypeName(entry.request.type);
    info.age_seconds = std::chrono::duration<double>(now - entry.enqueued).count();
    if (coordinator_) info.missing_ranks = coordinator_->missingRanks(key.first, key.second);
    pending.push_back(std::move(info));
  }
  metrics_.setPending(std::move(pending));
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

void BackgroundLoop::beginShutdown() {
  shutdown_sent_ = true;
  shutdown_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(config_.timeout_seconds));
  Status status(common::Code::kShutDown, kShutdownMessage);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& e : submitted_) handles_.complete(e.handle, status);
    submitted_.clear();
    in_flight_.clear();
  }
  for (auto& [key, entry] : entries_) handles_.complete(entry.handle, status);
  entries_.clear();
  to_execute_.clear();
  if (failed_ || mesh_.size() == 1) {
    finished_ = true;
    return;
  }
  if (mesh_.rank() == 0) {
    shutdown_ranks_.insert(0);
  } else {
    Status sent = mesh_.control(0)->send(static_cast<uint32_t>(MessageType::kShutdown), "", 1.0);
    if (!sent.isOk()) finished_ = true;
  }
}

void BackgroundLoop::checkShutdownAgreement() {
  if (finished_) return;
  if (mesh_.rank() == 0 && static_cast<int>(shutdown_ranks_.size()) == mesh_.size()) {
    for (int w = 1; w < mesh_.size(); ++w) {
      mesh_.control(w)->send(static_cast<uint32_t>(MessageType::kShutdown), "", 1.0);
    }
    finished_ = true;
    return;
  }
  if (Clock::now() > shutdown_deadline_) {
    HVD_LOG(kWarning, "runtime") << "shutdown: not every rank shut down within "
                                 << config_.timeout_seconds << " s; closing anyway";
    finished_ = true;
  }
}

}  // namespace hvd::runtime
