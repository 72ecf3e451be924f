#include "runtime/device_path.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "algo/algorithms.h"
#include "common/text.h"
#include "runtime/device_nccl_setup.h"
#include "transport/cuda/device_kernels.h"
#include "transport/mesh.h"
#include "transport/nccl/loader.h"

namespace hvd::runtime {

namespace nccl = transport::nccl;
using common::Status;

// Note [Device path choice]
//   A. Every member describes itself in a fixed-size record: the PCI bus id of its GPU,
//      whether NCCL is loaded, whether it can do CUDA IPC (the runtime has the IPC entry
//      points and the device kernels compiled: deviceKernelsReady()), what HVD_GPU_PATH asks;
//      an allgather over the set's CPU Comm gives every member every record.
//   B. Every member derives the same answer from the same records: staged when a member asks
//      for it. IPC when every member is on one host and names the same GPU, every member can
//      do IPC, and none asks for NCCL (else staged, saying which member cannot). Otherwise
//      staged when a member has no NCCL, or when two members on one host name the same GPU
//      (NCCL refuses duplicate GPUs in a communicator: "Duplicate GPU detected"; a set that
//      mixes shared and distinct GPUs is not served by IPC yet); else NCCL.
//      HVD_GPU_PATH=nccl (or =ipc) on a member where that path is impossible fails the op on
//      every member; so do members demanding different paths.
//   F. NCCL on a shared GPU, only when demanded (HVD_GPU_PATH=nccl): NCCL 2.30+ takes at most
//      two ranks per GPU when NCCL_MULTI_RANK_GPU_ENABLE=1 (experimental there; NVLS off), and
//      refuses any older version or a third rank. Each member's record carries its NCCL
//      version, its HVD_GPU_PATH and that variable (read once into its Config; engine_native's
//      init sets it under HVD_GPU_PATH=nccl unless the user did), so every member names the
//      same obstacle — a member sharing the GPU that does not ask for NCCL among them — before
//      NCCL is asked. A mixed set (several GPUs, at most two ranks on each) whose ranks all ask
//      takes one NCCL communicator the same way. Never
//      chosen by itself: on one GPU, CUDA IPC moves the bytes once where NCCL's ring moves them
//      through its channels twice; the path exists to run NCCL's code on a one-GPU machine.
//   C. NCCL: createCommunicator (Note [NCCL set-up outcome] in device_nccl_setup.cc).
//   E. A mixed set — several GPUs, some shared by several members (the hierarchical shape of
//      hosts, one level down): when every member can do IPC and has NCCL and none asks for
//      NCCL or staging, the members of each GPU connect over IPC among themselves (a Comm of
//      those members), the first member of each GPU (its leader) joins an NCCL communicator
//      of the leaders, and an allgather over the whole set of every step's outcome keeps the
//      members in agreement: any failure stages the whole set. Its allreduce is hierarchical
//      (device_mixed_ops.cc); its other collectives stage.
//   D. IPC (connectIpc): every member allocates and exports its buffer and events and
//      allgathers the handles; every member opens the others'; an allgather of the outcomes
//      follows, and if any member failed, every member closes what it opened and stages,
//      naming each failure. The same exchange runs again when an op needs larger slots
//      (Note [IPC slot size] in device_ipc_steps.cc).
namespace {

// HVD_GPU_PATH as a member record carries it.
enum Wanted : int32_t { kWantsAuto = 0, kWantsNccl = 1, kWantsStaged = 2, kWantsIpc = 3 };

struct MemberRecord {
  char bus_id[64];
  int32_t nccl_loaded;
  int32_t wanted;             // a Wanted
  int32_t nccl_version;       // ncclGetVersion's code, 0 without NCCL (F)
  int32_t multi_rank_per_gpu;  // NCCL_MULTI_RANK_GPU_ENABLE=1 here (F)
};

constexpr int kMultiRankGpuNccl = 23000;  // F: NCCL 2.30.0
constexpr int kMaxNcclRanksPerGpu = 2;    // F
constexpr char kChooseForMe[] =
    "unset HVD_GPU_PATH on every rank to let the core choose (CUDA IPC for ranks sharing a "
    "GPU, NCCL for one rank per GPU, else the staged path)";

struct IpcRecord {  // A, second round: only for a set on one GPU
  int32_t capable;
  char why[188];  // why not, when !capable
};

struct InitOutcome {
  int32_t ok;
  char error[252];
};

std::vector<std::vector<int>> gpuGroups(transport::Comm& comm,
                                        const std::vector<MemberRecord>& records);

std::string rankList(transport::Comm& comm, const std::vector<int>& members) {
  std::string text;
  for (size_t i = 0; i < members.size(); ++i) {
    text += (i == 0 ? "" : i + 1 == members.size() ? " and " : ", ") +
            std::to_string(comm.globalRank(members[i]));
  }
  return text;
}

// B and F: why NCCL cannot take the members sharing a GPU, "" when none share one or when NCCL
// 2.30+ with NCCL_MULTI_RANK_GPU_ENABLE=1 takes them (at most two a GPU).
std::string sharedGpu(transport::Comm& comm, const std::vector<MemberRecord>& records) {
  for (const auto& group : gpuGroups(comm, records)) {
    if (group.size() < 2) continue;
    const std::string who = "ranks " + rankList(comm, group) + " share GPU " +
                            common::fieldText(records[group[0]].bus_id) + " on one host";
    for (int r : group) {
      if (records[r].nccl_version < kMultiRankGpuNccl) {
        const std::string rank = std::to_string(comm.globalRank(r));
        return who + (records[r].nccl_version > 0
                          ? ", which NCCL " + nccl::ncclVersionText(records[r].nccl_version) +
                                " (rank " + rank + ") refuses"
                          : ", and rank " + rank + " could not read its NCCL's version") +
               ": start one rank per GPU for NCCL, or point HVD_NCCL_LIBRARY at NCCL 2.30 or "
               "newer, which takes two ranks per GPU";
      }
      if (records[r].wanted != kWantsNccl) {
        return who + ", and rank " + std::to_string(comm.globalRank(r)) + " does not set "
               "HVD_GPU_PATH=nccl: NCCL takes ranks sharing a GPU only when each of them asks";
      }
      if (!records[r].multi_rank_per_gpu) {
        return who + ", and NCCL takes two ranks per GPU only with "
               "NCCL_MULTI_RANK_GPU_ENABLE=1, which rank " + std::to_string(comm.globalRank(r)) +
               " has set to 0 (HVD_GPU_PATH=nccl sets it to 1 unless it is set)";
      }
    }
    if (group.size() > kMaxNcclRanksPerGpu) {
      return who + "; NCCL takes at most " + std::to_string(kMaxNcclRanksPerGpu) +
             " ranks per GPU: start fewer ranks per GPU for NCCL";
    }
  }
  return "";
}

bool oneGpu(transport::Comm& comm, const std::vector<MemberRecord>& records) {
  for (int r = 1; r < comm.size(); ++r) {
    if (std::strncmp(records[r].bus_id, records[0].bus_id, sizeof(records[r].bus_id)) != 0 ||
        !comm.mesh().sameHost(comm.globalRank(0), comm.globalRank(r))) {
      return false;
    }
  }
  return comm.size() > 1;
}

// B, for a set on one GPU: "" for IPC, else why not.
// The members sharing each GPU (same host, same bus id), set ranks, in order of first member.
std::vector<std::vector<int>> gpuGroups(transport::Comm& comm,
                                        const std::vector<MemberRecord>& records) {
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < comm.size(); ++r) {
    bool placed = false;
    for (auto& g : groups) {
      if (std::strncmp(records[g[0]].bus_id, records[r].bus_id, sizeof(records[r].bus_id)) == 0 &&
          comm.mesh().sameHost(comm.globalRank(g[0]), comm.globalRank(r))) {
        g.push_back(r);
        placed = true;
        break;
      }
    }
    if (!placed) groups.push_back({r});
  }
  return groups;
}

bool isMixed(const std::vector<std::vector<int>>& groups) {
  if (groups.size() < 2) return false;
  for (const auto& g : groups) {
    if (g.size() > 1) return true;
  }
  return false;
}

std::string ipcReason(transport::Comm& comm, const std::vector<IpcRecord>& ipc) {
  if (comm.size() > transport::cuda::kMaxReduceSources) {
    return std::to_string(comm.size()) + " ranks share the GPU; the device reduction takes at "
           "most " + std::to_string(transport::cuda::kMaxReduceSources);
  }
  for (int r = 0; r < comm.size(); ++r) {
    if (!ipc[r].capable) {
      return "rank " + std::to_string(comm.globalRank(r)) + " cannot use CUDA IPC: " +
             common::fieldText(ipc[r].why);
    }
  }
  return "";
}

// B: the reason to stage, or "" for NCCL; the same on every member.
std::string stagingReason(transport::Comm& comm, const std::vector<MemberRecord>& records) {
  for (int r = 0; r < comm.size(); ++r) {
    if (records[r].wanted == kWantsStaged) {
      return "HVD_GPU_PATH=staged on rank " + std::to_string(comm.globalRank(r));
    }
  }
  for (int a = 0; a < comm.size(); ++a) {
    for (int b = 0; b < comm.size(); ++b) {
      if (records[a].wanted == kWantsNccl && records[b].wanted == kWantsIpc) {
        return "the ranks disagree: HVD_GPU_PATH=nccl on rank " +
               std::to_string(comm.globalRank(a)) + ", HVD_GPU_PATH=ipc on rank " +
               std::to_string(comm.globalRank(b));
      }
    }
  }
  for (int r = 0; r < comm.size(); ++r) {
    if (records[r].wanted == kWantsIpc && !oneGpu(comm, records) &&
        !isMixed(gpuGroups(comm, records))) {
      return "HVD_GPU_PATH=ipc on rank " + std::to_string(comm.globalRank(r)) + ", but CUDA "
             "IPC serves only sets whose ranks share one GPU on one host (or, mixed, several "
             "such GPUs), and here no two ranks share one";
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

// A: whether this rank can do IPC, and why not. deviceKernelsReady() compiles the kernels for
// the current device once per process (the stream selected it).
void describeIpc(IpcRecord* mine) {
  const nccl::CudaApi* cuda = nccl::cudaApi();
  std::string why;
  if (cuda == nullptr || !cuda->hasIpc()) {
    why = "its CUDA runtime lacks the cudaIpc* entry points";
  } else {
    Status kernels = transport::cuda::deviceKernelsReady();
    if (!kernels.isOk()) why = "no device kernels: " + kernels.message();
  }
  mine->capable = why.empty() ? 1 : 0;
  std::strncpy(mine->why, why.c_str(), sizeof(mine->why) - 1);
}

constexpr size_t kFirstIpcSlotBytes = size_t{1} << 20;  // grows with the ops (device_ipc_steps.cc)

}  // namespace

Status connectIpc(transport::Comm& comm, nccl::DeviceStream& stream, size_t slot_bytes,
                  bool host_ordered, std::unique_ptr<transport::cuda::IpcPeers>* peers,
                  std::string* why) {
  auto mine = std::make_unique<transport::cuda::IpcPeers>(stream, host_ordered);
  transport::cuda::IpcExport exported;
  mine->exportOwn(slot_bytes, &exported);
  std::vector<transport::cuda::IpcExport> all;
  HVD_RETURN_IF_ERROR(allgatherRecords(comm, exported, &all));
  InitOutcome outcome{};
  std::string local_error;
  for (int r = 0; r < comm.size() && local_error.empty(); ++r) {
    if (!all[r].ok) {
      local_error = r == comm.rank() ? common::fieldText(all[r].error)
                                     : "rank " + std::to_string(comm.globalRank(r)) +
                                           " exported nothing";
    }
  }
  if (local_error.empty()) {
    Status opened = mine->openPeers(all, comm.rank());
    if (!opened.isOk()) local_error = opened.message();
  }
  outcome.ok = local_error.empty() ? 1 : 0;
  std::strncpy(outcome.error, local_error.c_str(), sizeof(outcome.error) - 1);
  std::vector<InitOutcome> outcomes;
  HVD_RETURN_IF_ERROR(allgatherRecords(comm, outcome, &outcomes));
  std::string failures;
  for (int r = 0; r < comm.size(); ++r) {
    if (outcomes[r].ok) continue;
    failures += (failures.empty() ? "" : "; ") + std::string("rank ") +
                std::to_string(comm.globalRank(r)) + ": " +
                common::fieldText(outcomes[r].error);
  }
  if (!failures.empty()) {
    *why = "CUDA IPC could not connect the ranks sharing the GPU (" + failures + ")";
    return Status::ok();  // `mine` closes what it opened
  }
  *peers = std::move(mine);
  return Status::ok();
}

namespace {

// Every member's outcome of one step of E, shared: "" when all succeeded, else each failure.
Status agree(transport::Comm& comm, const std::string& local_error, std::string* failures) {
  InitOutcome mine{};
  mine.ok = local_error.empty() ? 1 : 0;
  std::strncpy(mine.error, local_error.c_str(), sizeof(mine.error) - 1);
  std::vector<InitOutcome> all;
  HVD_RETURN_IF_ERROR(allgatherRecords(comm, mine, &all));
  failures->clear();
  for (int r = 0; r < comm.size(); ++r) {
    if (all[r].ok) continue;
    *failures += (failures->empty() ? "" : "; ") + std::string("rank ") +
                 std::to_string(comm.globalRank(r)) + ": " + common::fieldText(all[r].error);
  }
  return Status::ok();
}

// E. out->why says why not, on every member alike.
Status connectMixed(transport::Comm& comm, nccl::DeviceStream& stream,
                    const std::vector<MemberRecord>& records,
                    const std::vector<std::vector<int>>& groups, PathChoice* out) {
  IpcRecord ipc_mine{};
  describeIpc(&ipc_mine);
  std::vector<IpcRecord> ipc;
  HVD_RETURN_IF_ERROR(allgatherRecords(comm, ipc_mine, &ipc));
  out->why = ipcReason(comm, ipc);
  for (int r = 0; r < comm.size() && out->why.empty(); ++r) {
    if (!records[r].nccl_loaded) {
      out->why = "rank " + std::to_string(comm.globalRank(r)) + " has no usable NCCL for the "
                 "GPUs' leaders (engine_native.gpu.nccl_info() there says why)";
    }
  }
  if (!out->why.empty()) return Status::ok();
  std::vector<int> mine, leaders;
  for (const auto& g : groups) {
    leaders.push_back(comm.globalRank(g[0]));
    if (std::find(g.begin(), g.end(), comm.rank()) == g.end()) continue;
    for (int r : g) mine.push_back(comm.globalRank(r));
  }
  auto gpu_comm = std::make_unique<transport::Comm>(comm.mesh(), mine, comm.timeoutSeconds(),
                                                    comm.spinMicroseconds());
  std::unique_ptr<transport::cuda::IpcPeers> peers;
  std::string ipc_why, failures;
  // Device-ordered: the leaders' NCCL step sits between two IPC steps on the same stream, and
  // a host-ordered step would block the loop on it (Note [IPC step protocol]).
  HVD_RETURN_IF_ERROR(connectIpc(*gpu_comm, stream, kFirstIpcSlotBytes, /*host_ordered=*/false,
                                 &peers, &ipc_why));
  HVD_RETURN_IF_ERROR(agree(comm, ipc_why, &failures));
  if (!failures.empty()) {
    out->why = "CUDA IPC could not connect the ranks sharing a GPU (" + failures + ")";
    return Status::ok();
  }
  const bool leader = gpu_comm->rank() == 0;
  PathChoice across;
  std::string nccl_error;
  if (leader) {
    transport::Comm leader_comm(comm.mesh(), leaders, comm.timeoutSeconds(),
                                comm.spinMicroseconds());
    HVD_RETURN_IF_ERROR(createCommunicator(leader_comm, stream, &across));
    if (!across.nccl) nccl_error = across.why;
  }
  HVD_RETURN_IF_ERROR(agree(comm, nccl_error, &failures));
  if (!failures.empty()) {
    out->why = "the GPUs' leaders could not set up NCCL (" + failures + ")";
    return Status::ok();
  }
  out->mixed = true;
  out->leader = leader;
  out->peers = std::move(peers);
  out->gpu_comm = std::move(gpu_comm);
  out->communicator = std::move(across.communicator);
  return Status::ok();
}

}  // namespace

Status choosePath(transport::Comm& comm, nccl::DeviceStream& stream, const PathWish& wish,
                  PathChoice* out) {
  const std::string& wanted = wish.wanted;
  MemberRecord mine{};
  std::string bus_id;
  HVD_RETURN_IF_ERROR(stream.pciBusId(&bus_id));
  std::strncpy(mine.bus_id, bus_id.c_str(), sizeof(mine.bus_id) - 1);
  const nccl::NcclApi* api = nccl::ncclApi();
  mine.nccl_loaded = api != nullptr ? 1 : 0;
  if (api != nullptr && api->getVersion(&mine.nccl_version) != nccl::kNcclSuccess) {
    mine.nccl_version = 0;
  }
  mine.multi_rank_per_gpu = wish.nccl_multi_rank_gpu ? 1 : 0;
  mine.wanted = wanted == "nccl" ? kWantsNccl : wanted == "staged" ? kWantsStaged
                 : wanted == "ipc" ? kWantsIpc : kWantsAuto;
  std::vector<MemberRecord> records;
  HVD_RETURN_IF_ERROR(allgatherRecords(comm, mine, &records));  // A
  out->why = stagingReason(comm, records);                       // B
  bool nccl_demanded = false, ipc_demanded = false, staged_demanded = false;
  for (const MemberRecord& r : records) {
    nccl_demanded = nccl_demanded || r.wanted == kWantsNccl;
    ipc_demanded = ipc_demanded || r.wanted == kWantsIpc;
    staged_demanded = staged_demanded || r.wanted == kWantsStaged;  // (B gives it first)
  }
  if (staged_demanded) {
  } else if (nccl_demanded) {
    if (out->why.empty()) HVD_RETURN_IF_ERROR(createCommunicator(comm, stream, out));  // C, F
  } else if (oneGpu(comm, records)) {
    IpcRecord ipc_mine{};
    describeIpc(&ipc_mine);
    std::vector<IpcRecord> ipc;
    HVD_RETURN_IF_ERROR(allgatherRecords(comm, ipc_mine, &ipc));
    out->why = ipcReason(comm, ipc);
    if (out->why.empty()) {
      HVD_RETURN_IF_ERROR(connectIpc(comm, stream, kFirstIpcSlotBytes, wish.ipc_host_ordered,
                                     &out->peers, &out->why));
      out->ipc = out->peers != nullptr;  // D
    }
  } else if (isMixed(gpuGroups(comm, records))) {
    HVD_RETURN_IF_ERROR(connectMixed(comm, stream, records, gpuGroups(comm, records), out));  // E
  } else if (out->why.empty()) {
    HVD_RETURN_IF_ERROR(createCommunicator(comm, stream, out));  // C
  }
  if (!out->nccl && nccl_demanded) {
    return common::internalError("HVD_GPU_PATH=nccl, but NCCL cannot serve this process set: " +
                                 out->why + "; " + kChooseForMe);
  }
  if (!out->ipc && !out->mixed && ipc_demanded) {
    return common::internalError("HVD_GPU_PATH=ipc, but CUDA IPC cannot serve this process "
                                 "set: " + out->why + "; " + kChooseForMe);
  }
  return Status::ok();
}

}  // namespace hvd::runtime
