// C of Note [Device path choice] (device_nccl_setup.h): an NCCL communicator per process set.
#include "runtime/device_nccl_setup.h"

#include <chrono>
#include <cstring>
#include <functional>
#include <string>

#include "common/text.h"
#include "transport/mesh.h"

namespace hvd::runtime {

namespace nccl = transport::nccl;
using common::Status;

// Note [NCCL set-up outcome]
//   a. Set rank 0 makes the unique id and broadcasts it (with a flag: making it may fail)
//      over the CPU Comm.
//   b. Every member creates its communicator, waiting at most HVD_TIMEOUT (Note [Non-blocking
//      set-up] in communicator.h). abort() or a lost peer during the wait fails this member's
//      core at once; the others learn it through Note [Failure fan-out].
//   c. An allgather of the outcomes. A member that failed at once waits here while the others
//      may still wait in b until their deadline, so this exchange allows twice HVD_TIMEOUT.
//   d. If any member timed out, every member fails, naming the members whose NCCL failed: a
//      member failing inside set-up leaves the others waiting, and is the likely cause.
//      Otherwise, if any member failed (every member then finished, each with its error),
//      every member drops its communicator and stages, naming each failure.
namespace {

struct UniqueIdMessage {
  int32_t ok;
  nccl::NcclUniqueId id;
};

// c: what each member tells the others.
struct SetupOutcome {
  int32_t state;  // SetupState
  char error[252];
};
enum SetupState : int32_t { kSetUp = 0, kNcclFailed = 1, kTimedOut = 2 };

// d, when some member timed out: the core fails on every member, naming the
// members whose NCCL failed (the likely cause) before those that only waited.
Status setupFailure(transport::Comm& comm, const std::vector<SetupOutcome>& outcomes) {
  std::string failed, waited;
  for (int r = 0; r < comm.size(); ++r) {
    const std::string rank = std::to_string(comm.globalRank(r));
    if (outcomes[r].state == kNcclFailed) {
      failed += (failed.empty() ? "" : "; ") + ("rank " + rank + ": ") +
                common::fieldText(outcomes[r].error);
    } else if (outcomes[r].state == kTimedOut) {
      waited += (waited.empty() ? "" : ", ") + rank;
    }
  }
  common::Text text;
  text << "NCCL could not set up a communicator for this process set: ";
  if (!failed.empty()) text << "it failed on " << failed << "; ";
  text << "rank(s) " << waited << " waited HVD_TIMEOUT (" << comm.timeoutSeconds()
       << " s) for the others to join. "
       << (failed.empty() ? "No member reported an error: look for a rank stuck before or "
                            "inside NCCL set-up (NCCL_DEBUG=INFO shows its progress), or raise "
                            "HVD_TIMEOUT if set-up is only slow on this cluster."
                          : "Fix the failing rank (NCCL_DEBUG=INFO there says more), then "
                            "shutdown() and init() again.");
  return common::timedOut(text.str());
}

}  // namespace

std::function<Status()> setupInterruption(transport::Mesh& mesh) {
  return [&mesh]() -> Status {
    if (mesh.aborted()) {
      return common::aborted("aborted on rank " + std::to_string(mesh.rank()) +
                             " during NCCL communicator set-up");
    }
    const int lost = mesh.findLostPeer();
    if (lost < 0) return Status::ok();
    return common::peerLost("lost connection to rank " + std::to_string(lost) +
                            " during NCCL communicator set-up");
  };
}

Status createCommunicator(transport::Comm& comm, nccl::DeviceStream& stream, PathChoice* out) {
  UniqueIdMessage message{};
  std::string local_error;
  if (comm.rank() == 0) {
    Status made = nccl::NcclCommunicator::createUniqueId(&message.id);
    message.ok = made.isOk() ? 1 : 0;
    if (!made.isOk()) local_error = made.message();
  }
  HVD_RETURN_IF_ERROR(algo::broadcastTree(comm, &message, sizeof(message), 0));
  auto communicator = std::make_unique<nccl::NcclCommunicator>(stream);
  SetupOutcome mine{};
  mine.state = kSetUp;
  if (message.ok) {
    nccl::NcclCommunicator::SetupWait wait;
    wait.timeout_seconds = comm.timeoutSeconds();
    wait.deadline = std::chrono::steady_clock::now() +
                    std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                        std::chrono::duration<double>(comm.timeoutSeconds()));
    wait.interrupted = setupInterruption(comm.mesh());
    Status init = communicator->init(message.id, comm.rank(), comm.size(), wait);
    if (init.code() == common::Code::kAborted || init.code() == common::Code::kPeerLost) {
      return init;  // the core fails here; Note [Failure fan-out] tells the others
    }
    if (init.code() == common::Code::kTimeout) mine.state = kTimedOut;
    if (!init.isOk()) local_error = init.message();
  } else if (comm.rank() != 0) {
    local_error = "set rank 0 could not make an NCCL unique id";
  }
  if (mine.state == kSetUp && !local_error.empty()) mine.state = kNcclFailed;
  std::strncpy(mine.error, local_error.c_str(), sizeof(mine.error) - 1);
  // A member that failed at once waits here while the others may poll until their deadline.
  std::vector<int> members;
  for (int r = 0; r < comm.size(); ++r) members.push_back(comm.globalRank(r));
  transport::Comm patient(comm.mesh(), members, 2 * comm.timeoutSeconds(),
                          comm.spinMicroseconds());
  std::vector<SetupOutcome> outcomes;
  HVD_RETURN_IF_ERROR(allgatherRecords(patient, mine, &outcomes));
  std::string failures;  // every member's error: the first one may only echo another's
  bool timed_out = false;
  for (int r = 0; r < comm.size(); ++r) {
    timed_out = timed_out || outcomes[r].state == kTimedOut;
    if (outcomes[r].state == kSetUp) continue;
    failures += (failures.empty() ? "" : "; ") + std::string("rank ") +
                std::to_string(comm.globalRank(r)) + ": " +
                common::fieldText(outcomes[r].error);
  }
  if (timed_out) return setupFailure(comm, outcomes);
  if (!failures.empty()) {  // every member finished, some with an error: stage
    communicator->abort();
    out->why = "NCCL could not set up a communicator (" + failures + ")";
    return Status::ok();
  }
  out->nccl = true;
  out->communicator = std::move(communicator);
  return Status::ok();
}

}  // namespace hvd::runtime
