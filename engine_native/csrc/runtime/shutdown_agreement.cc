// The shutdown agreement of BackgroundLoop (background_loop.h): every rank tells rank 0 it is
// shutting down, rank 0 answers once all have, and a rank gives up waiting after HVD_TIMEOUT
// (one second when it still had work queued, so peers blocked on it are not held long).
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

void BackgroundLoop::beginShutdown() {
  shutdown_sent_ = true;
  shutdown_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(config_.timeout_seconds));
  Status status(common::Code::kShutDown, kShutdownMessage);
  if (!entries_.empty()) {
    // Peers may be blocked in a collective with this rank: do not make them wait long.
    shutdown_deadline_ = std::min(shutdown_deadline_, Clock::now() + std::chrono::seconds(1));
  }
  completeAllPending(status, /*store_failure=*/false);
  if (failed_ || mesh_.size() == 1) {
    finished_ = true;
    return;
  }
  if (mesh_.rank() == 0) {
    coordinator_->noteShutdown(0);
  } else {
    Status sent = mesh_.control(0)->send(static_cast<uint32_t>(MessageType::kShutdown), "", 1.0);
    if (!sent.isOk()) finished_ = true;
  }
}

void BackgroundLoop::checkShutdownAgreement() {
  if (finished_) return;
  if (mesh_.rank() == 0 && coordinator_->shutDownRanks() == mesh_.size()) {
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
