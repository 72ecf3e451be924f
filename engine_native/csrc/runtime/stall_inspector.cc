// The stall inspector (stall_inspector.h): pending tensors, stall warnings, deadlock shutdown.
#include "runtime/stall_inspector.h"

#include <string>
#include <vector>

#include "common/coarse_clock.h"
#include "common/logging.h"

namespace hvd::runtime {

StallInspector::StallInspector(Metrics& metrics, const common::Config& config,
                               const coord::KeyTable& keys, SubmissionQueue& queue)
    : metrics_(metrics), config_(config), keys_(keys), queue_(queue),
      last_check_(Clock::now()), last_report_(last_check_) {}

void StallInspector::inspect(EntryTable& entries, RankZeroCoordinator* coordinator,
                             const PeerOps& peers, const OneRound& board) {
  // Every pass comes here: the coarse clock decides (a check up to a tick late is fine).
  if (common::coarseSteadyNow() - last_check_ < std::chrono::milliseconds(200)) return;
  auto now = Clock::now();
  const std::vector<int> board_missing = board.missingRanks();
  std::vector<PendingInfo> pending;
  entries.forEach([&](const TensorEntry& entry) {
    PendingInfo info;
    info.name = keys_.name(entry.request.key);
    info.op = coord::opTypeName(entry.request.type);
    info.age_seconds = std::chrono::duration<double>(now - entry.enqueued).count();
    if (!board_missing.empty() && board.holds(entry.request.key)) {
      info.missing_ranks = board_missing;
    } else if (coordinator) {
      info.missing_ranks = coordinator->missingRanks(entry.request.key);
    }
    pending.push_back(std::move(info));
  });
  peers.appendPending(now, &pending);
  metrics_.setPending(std::move(pending));
  if (coordinator) metrics_.setShuttingDown(coordinator->shutDownRankList());
  if (coordinator) failDeadlocked(*coordinator, now);
  if (!board_missing.empty() && !config_.stall_check_disable &&
      now - last_board_report_ >= std::chrono::duration<double>(config_.stall_check_seconds)) {
    const std::string report = board.stallReport(config_.stall_check_seconds);
    if (!report.empty()) {
      HVD_LOG(kWarning, "stall") << report;
      last_board_report_ = now;
    }
  }
  if (!coordinator || config_.stall_check_disable) {
    last_check_ = now;
    return;
  }
  auto period = std::chrono::duration<double>(config_.stall_check_seconds);
  if (now - last_report_ >= period) {
    last_report_ = now;
    std::string report = coordinator->stallReport(
        std::chrono::seconds(static_cast<int64_t>(config_.stall_check_seconds)));
    if (!report.empty()) HVD_LOG(kWarning, "stall") << report;
  }
  last_check_ = now;
}

// Note [Deadlock shutdown] in coord/deadlock.cc: the error Responses leave with the next
// coordinate(), on every member of their sets.
void StallInspector::failDeadlocked(RankZeroCoordinator& coordinator, Clock::time_point now) {
  constexpr double kStallShutdownChecks = 4;  // a negative time: this many warning periods
  double seconds = config_.stall_shutdown_seconds;
  if (seconds < 0) seconds = kStallShutdownChecks * config_.stall_check_seconds;
  if (seconds == 0) return;
  const std::string report =
      coordinator.failDeadlocked(now, std::chrono::duration<double>(seconds));
  if (report.empty()) return;
  HVD_LOG(kError, "stall") << report;
  queue_.wakeIfAsleep();
}

}  // namespace hvd::runtime
