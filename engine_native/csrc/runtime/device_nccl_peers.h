// DeviceNcclPeers: point-to-point of CUDA tensors through NCCL (issue #36): a two-rank NCCL
// communicator per ordered pair of ranks (this rank sending to a peer, or receiving from one),
// made at the pair's first message, its ncclSend and ncclRecv on a stream of its own, and
// their completions. Note [NCCL point-to-point] in device_nccl_peers.cc has the rules. Owned
// by PeerOps, which moves the frames; background thread only (whoever holds the loop's
// progress lock).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "runtime/device_loop_wake.h"
#include "runtime/handle_table.h"
#include "runtime/host_copy_streams.h"
#include "runtime/ready_events.h"
#include "transport/mesh.h"
#include "transport/nccl/communicator.h"
#include "transport/nccl/device_stream.h"

namespace hvd::runtime {

class DeviceNcclPeers {
 public:
  // host_copies: the per-device streams of host copies (shared, outlives this).
  DeviceNcclPeers(transport::Mesh& mesh, int wake_fd, double timeout_seconds,
                  HostCopyStreams& host_copies);
  ~DeviceNcclPeers();
  DeviceNcclPeers(const DeviceNcclPeers&) = delete;
  DeviceNcclPeers& operator=(const DeviceNcclPeers&) = delete;

  // Whether this rank can take part: the CUDA runtime and NCCL (2.14+) are loaded.
  static bool available();

  // Sender (B): queues ncclSend of `bytes` (> 0) at `data` on `device`, after `ready`, to
  // `peer`; poll() reports `id` once NCCL finished with it. The pair's first message starts its
  // set-up: *id_payload gets the unique id, which must reach the peer (kNcclId) before this
  // message's frame; empty afterwards.
  common::Status send(int peer, int device, ReadyEvent ready, const void* data, uint64_t bytes,
                      uint64_t id, const std::string& what, std::string* id_payload);
  // Receiver (C): `peer`'s unique id came.
  common::Status joined(int peer, const void* id_bytes);
  // Receiver (C): `device` reads CUDA messages from `peer` if none was named before.
  void useDevice(int peer, int device);
  int deviceOf(int peer) const;  // -1 while none was named
  // Receiver (D): a kDeviceNccl frame of `bytes` (> 0) came from `peer`: its ncclRecv into
  // core-owned device memory is queued (in arrival order); poll() reports *slot with it.
  common::Status arrived(int peer, uint64_t bytes, const std::string& what, uint64_t* slot);
  // Receiver (D), a receive ordered on its consumer's stream (Note [Device point-to-point] I):
  // once slot's ncclRecv is queued, `consumer` waits for it on the device and *output is its
  // memory (its later Done is then only the transfer's end); before that, *output stays null.
  common::Status handOver(uint64_t slot, int64_t consumer,
                          std::shared_ptr<OutputBuffer>* output);
  // A finished receive's bytes in host memory (E): blocks for the copy alone.
  common::Status toHost(const OutputBuffer& device_bytes, std::shared_ptr<OutputBuffer>* host);

  struct Done {
    uint64_t id = 0;       // a send's id, or a receive's slot
    bool receive = false;
    int peer = -1;
    std::shared_ptr<OutputBuffer> output;  // a receive's, on the pair's device
  };
  // Advances set-ups, queues what waited for them, appends finished transfers. Non-OK (naming
  // the op) when a set-up failed or a transfer made no progress for HVD_TIMEOUT: the rank fails.
  common::Status poll(std::vector<Done>* done);
  bool busy() const { return !transfers_.empty() || setting_up_ > 0; }
  // The rank failed: aborts every communicator (a transfer waiting on a peer ends), waits a
  // bounded time for the streams, forgets everything.
  void abandon();

 private:
  struct Pending {  // a transfer queued before its communicator was ready
    uint64_t id = 0;
    ReadyEvent ready;
    const void* data = nullptr;
    uint64_t bytes = 0;
    std::string what;
  };
  struct Link {  // one direction of one pair
    int peer = -1;
    bool receiving = false;
    int device = -1;
    bool has_id = false;
    transport::nccl::NcclUniqueId id{};
    bool started = false, ready = false;
    common::Status failure;  // a set-up that could not start: pollSetups() reports it
    std::unique_ptr<transport::nccl::DeviceStream> stream;  // before comm: outlives it
    std::unique_ptr<transport::nccl::NcclCommunicator> comm;
    std::deque<Pending> waiting;
  };
  struct Transfer {
    Link* link = nullptr;
    uint64_t id = 0;
    std::string what;
    transport::nccl::CudaEvent done = nullptr;
    std::shared_ptr<OutputBuffer> output;
    std::chrono::steady_clock::time_point since;
  };

  Link& link(int peer, bool receiving);
  void startSetup(Link& l);  // failures land in l.failure
  common::Status issue(Link& l, Pending p);
  common::Status pollSetups();

  transport::Mesh& mesh_;
  LoopWake wake_;
  const double timeout_seconds_;
  std::map<std::pair<int, bool>, Link> links_;  // by (peer, receiving)
  std::map<int, int> devices_;                  // receiving: by peer (useDevice)
  HostCopyStreams& host_copies_;
  std::deque<Transfer> transfers_;
  int setting_up_ = 0;
  uint64_t next_slot_ = 1;
};

}  // namespace hvd::runtime
