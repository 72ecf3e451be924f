#include "runtime/device_path.h"

#include <cstring>
#include <vector>

#include "algo/algorithms.h"
#include "transport/mesh.h"
#include "transport/nccl/loader.h"

namespace hvd::runtime {

namespace nccl = transport::nccl;
using common::Status;

// Note [Device path choice]
//   A. Every member describes itself in a fixed-size record: the PCI bus id of its GPU,
//      whether NCCL is loaded, what HVD_GPU_PATH asks; an allgather over the set's CPU Comm
//      gives every member every record.
//   B. Every member derives the same answer from the same records: staged when a member asks
//      for it, when a member has no NCCL, or when two members on one host name the same GPU
//      (NCCL refuses duplicate GPUs in a communicator: "Duplicate GPU detected"); else NCCL.
//      HVD_GPU_PATH=nccl on a member where NCCL is impossible fails the op on every member.
//   C. NCCL: set rank 0 makes the unique id and broadcasts it (with a flag: making it may
//      fail) over the CPU Comm; every member creates its communicator (ncclCommInitRank
//      returns once all members joined); an allgather of the outcomes follows, and if any
//      member failed, every member drops its communicator and stages, naming each failure.
namespace {

struct MemberRecord {
  char bus_id[64];
  int32_t nccl_loaded;
  int32_t wanted;  // 0 auto, 1 nccl, 2 staged
};

struct UniqueIdMessage {
  int32_t ok;
  nccl::NcclUniqueId id;
};

struct InitOutcome {
  int32_t ok;
  char error[252];
};

template <typename T>
Status allgatherRecords(transport::Comm& comm, const T& mine, std::vector<T>* all) {
  all->resize(comm.size());
  std::vector<size_t> bytes(comm.size(), sizeof(T));
  return algo::allgatherRing(comm, &mine, all->data(), bytes);
}

std::string sharedGpu(transport::Comm& comm, const std::vector<MemberRecord>& records) {
  for (int a = 0; a < comm.size(); ++a) {
    for (int b = a + 1; b < comm.size(); ++b) {
      if (std::strncmp(records[a].bus_id, records[b].bus_id, sizeof(records[a].bus_id)) == 0 &&
          comm.mesh().sameHost(comm.globalRank(a), comm.globalRank(b))) {
        return "ranks " + std::to_string(comm.globalRank(a)) + " and " +
               std::to_string(comm.globalRank(b)) + " share GPU " + records[a].bus_id +
               " on one host, which NCCL refuses (start one rank per GPU for NCCL)";
      }
    }
  }
  return "";
}

// B: the reason to stage, or "" for NCCL; the same on every member.
std::string stagingReason(transport::Comm& comm, const std::vector<MemberRecord>& records) {
  for (int r = 0; r < comm.size(); ++r) {
    if (records[r].wanted == 2) {
      return "HVD_GPU_PATH=staged on rank " + std::to_string(comm.globalRank(r));
    }
  }
  for (int r = 0; r < comm.size(); ++r) {
    if (!records[r].nccl_loaded) {
      return "rank " + std::to_string(comm.globalRank(r)) + " has no usable NCCL "
             "(engine_native.gpu.nccl_info() there says why)";
    }
  }
  return sharedGpu(comm, records);
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
  InitOutcome mine{};
  if (message.ok) {
    Status init = communicator->init(message.id, comm.rank(), comm.size());
    if (!init.isOk()) local_error = init.message();
  } else if (comm.rank() != 0) {
    local_error = "set rank 0 could not make an NCCL unique id";
  }
  mine.ok = local_error.empty() ? 1 : 0;
  std::strncpy(mine.error, local_error.c_str(), sizeof(mine.error) - 1);
  std::vector<InitOutcome> outcomes;
  HVD_RETURN_IF_ERROR(allgatherRecords(comm, mine, &outcomes));
  std::string failures;  // every member's error: the first one may only echo another's
  for (int r = 0; r < comm.size(); ++r) {
    if (outcomes[r].ok) continue;
    failures += (failures.empty() ? "" : "; ") + std::string("rank ") +
                std::to_string(comm.globalRank(r)) + ": " + outcomes[r].error;
  }
  if (!failures.empty()) {
    communicator->abort();
    out->why = "NCCL could not set up a communicator (" + failures + ")";
    return Status::ok();
  }
  out->nccl = true;
  out->communicator = std::move(communicator);
  return Status::ok();
}

}  // namespace

Status choosePath(transport::Comm& comm, nccl::DeviceStream& stream, const std::string& wanted,
                  PathChoice* out) {
  MemberRecord mine{};
  std::string bus_id;
  HVD_RETURN_IF_ERROR(stream.pciBusId(&bus_id));
  std::strncpy(mine.bus_id, bus_id.c_str(), sizeof(mine.bus_id) - 1);
  mine.nccl_loaded = nccl::ncclApi() != nullptr ? 1 : 0;
  mine.wanted = wanted == "nccl" ? 1 : wanted == "staged" ? 2 : 0;
  std::vector<MemberRecord> records;
  HVD_RETURN_IF_ERROR(allgatherRecords(comm, mine, &records));  // A
  out->why = stagingReason(comm, records);                       // B
  bool demanded = false;
  for (const MemberRecord& r : records) demanded = demanded || r.wanted == 1;
  if (out->why.empty()) HVD_RETURN_IF_ERROR(createCommunicator(comm, stream, out));  // C
  if (!out->nccl && demanded) {
    return common::internalError("HVD_GPU_PATH=nccl, but NCCL cannot serve this process set: " +
                                 out->why + "; unset HVD_GPU_PATH to stage instead");
  }
  return Status::ok();
}

}  // namespace hvd::runtime
