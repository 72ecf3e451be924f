// NCCL point-to-point (runtime/device_nccl_peers.h).
//
// Note [NCCL point-to-point]
//   A. Route. A CUDA tensor goes by NCCL when this rank has the CUDA runtime and NCCL 2.14+
//      loaded and either the peer is on another host or HVD_GPU_PATH=nccl (PeerOps::cudaRoute).
//      The sender decides alone, from what it knows, and the frame's kind (kDeviceNccl) tells
//      the receiver: no round per message, nothing to agree before. The rule gives the same
//      answer on both ranks of a pair when they run the same configuration (HVD_GPU_PATH is a
//      job's setting; NCCL is loaded on every GPU rank); a receiver that cannot join (no NCCL,
//      no device) fails its receive saying why, and the sender's set-up or send then fails
//      after HVD_TIMEOUT (F). Two ranks sharing one GPU need what Note [Device path choice] F
//      says (NCCL 2.30+, NCCL_MULTI_RANK_GPU_ENABLE=1); otherwise NCCL's set-up fails, by F.
//   B. Sender. A communicator per ordered pair (sender rank 0, receiver rank 1), so each is
//      used in one direction only and the two directions of a pair never queue behind each
//      other. The pair's first message makes the unique id; the kNcclId frame carries it on the
//      pair's channel, before that message's frame (one byte stream: it arrives first). Set-up
//      is non-blocking (Note [Non-blocking set-up] in transport/nccl/communicator.h, its
//      start() and pollSetup()): the loop polls it each pass and does other work meanwhile;
//      HVD_TIMEOUT bounds it, abort() or a lost peer ends it. Sends submitted meanwhile wait
//      in the pair's queue, in order. Then, on the pair's stream: wait for the producer's event
//      (Horovod's stream contract), ncclSend, record an event. The frame (dtype, shape; no
//      payload) goes at once. The send completes when its frame is written and the event
//      fired: NCCL has taken the bytes, which with real NCCL means the receiver posted its
//      ncclRecv — D makes that happen without waiting for a receive.
//   C. Receiver. The pair's communicator is made (rank 1) once its kNcclId came and a device
//      is known: the device of the first receive from that peer that names one (the first
//      CUDA receive; frames that arrive before wait, as sends wait in B).
//   D. NCCL matches sends and receives in issue order per communicator, while receives here
//      match messages by (peer, tag) in any order (Note [Point-to-point] B). So the receiver
//      posts ncclRecv for every kDeviceNccl frame in ARRIVAL order, as the frame arrives, into
//      core-owned device memory (runtime/device_output_pool.h) — the same order the sender
//      issued its ncclSends — and keeps the memory with the arrived message (a slot); the
//      receive that takes the message gets it, once its ncclRecv finished, or at once where
//      it names its consumer's stream on the pair's device, which then waits for the ncclRecv
//      there (Note [Device point-to-point] I; handOver).
//   E. A receive whose result stays on the device gets that memory (on the pair's device,
//      whatever device it named); one into host memory gets a copy, made once the bytes are
//      final, on the device's stream that holds only such copies (HostCopyStreams, which
//      Note [Device point-to-point] D's copies share).
//   F. Errors, never hangs. A set-up that fails or does not finish in HVD_TIMEOUT, and a
//      transfer without progress for HVD_TIMEOUT (the peer stopped, never receives, or its
//      producer's kernel never ends), fail the rank naming the op (peer and tag); the other
//      rank learns it by Note [Failure fan-out], or fails by its own bound. A lost peer or
//      abort() fails the rank as for host messages; abandon() then aborts every communicator
//      (ncclCommAbort ends a transfer waiting on the peer), waits a bounded time for the
//      streams and keeps the outputs that may still be written until exit.
//   G. Not verified on a real GPU yet: this ran against the fake NCCL of tests/fakecuda only.
//      With real NCCL, several communicators busy at once on one GPU can deadlock if their
//      kernels cannot all be resident (NCCL's documentation on concurrent communicators).
#include "runtime/device_nccl_peers.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <utility>

#include "common/logging.h"
#include "common/text.h"
#include "runtime/device_nccl_setup.h"
#include "runtime/device_output_pool.h"
#include "runtime/host_output_pool.h"
#include "transport/nccl/loader.h"

namespace hvd::runtime {

using common::Status;
namespace nccl = transport::nccl;

DeviceNcclPeers::DeviceNcclPeers(transport::Mesh& mesh, int wake_fd, double timeout_seconds,
                                 HostCopyStreams& host_copies)
    : mesh_(mesh), wake_(wake_fd), timeout_seconds_(timeout_seconds),
      host_copies_(host_copies) {}

DeviceNcclPeers::~DeviceNcclPeers() { abandon(); }

bool DeviceNcclPeers::available() {
  const nccl::NcclApi* api = nccl::ncclApi();
  return nccl::cudaApi() != nullptr && api != nullptr && api->commInitRankConfig != nullptr;
}

DeviceNcclPeers::Link& DeviceNcclPeers::link(int peer, bool receiving) {
  Link& l = links_[{peer, receiving}];
  l.peer = peer;
  l.receiving = receiving;
  return l;
}

// B (rank 0) and C (rank 1): the stream, then the non-blocking set-up.
void DeviceNcclPeers::startSetup(Link& l) {
  nccl::DeviceRestorer restore;
  static std::atomic<bool> warned{false};  // G
  if (!warned.exchange(true)) {
    HVD_LOG(kWarning, "transport") << "CUDA point-to-point with rank " << l.peer << " goes by "
                                   << "NCCL (device " << l.device << "): this path has run "
                                   << "only against test fakes, never on a real GPU";
  }
  l.started = true;
  ++setting_up_;
  auto stream = std::make_unique<nccl::DeviceStream>();
  l.failure = stream->init(l.device);
  if (!l.failure.isOk()) return;
  l.stream = std::move(stream);
  l.comm = std::make_unique<nccl::NcclCommunicator>(*l.stream);
  nccl::NcclCommunicator::SetupWait wait;
  wait.timeout_seconds = timeout_seconds_;
  wait.deadline = std::chrono::steady_clock::now() +
                  std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double>(timeout_seconds_));
  wait.interrupted = setupInterruption(mesh_);
  l.failure = l.comm->start(l.id, l.receiving ? 1 : 0, 2, wait);
}

Status DeviceNcclPeers::send(int peer, int device, ReadyEvent ready, const void* data,
                             uint64_t bytes, uint64_t id, const std::string& what,
                             std::string* id_payload) {
  nccl::DeviceRestorer restore;
  id_payload->clear();
  Link& l = link(peer, /*receiving=*/false);
  if (!l.started) {
    HVD_RETURN_IF_ERROR(nccl::NcclCommunicator::createUniqueId(&l.id));
    l.has_id = true;
    l.device = device;
    id_payload->assign(l.id.internal, sizeof(l.id.internal));
    startSetup(l);
  } else if (device != l.device) {
    return common::invalidArgument(
        what + ": CUDA tensors to rank " + std::to_string(peer) + " go by NCCL from device " +
        std::to_string(l.device) + " (its first one's); this one is on device " +
        std::to_string(device) + ": move it there, or send it through host memory");
  }
  Pending p;
  p.id = id;
  p.ready = std::move(ready);
  p.data = data;
  p.bytes = bytes;
  p.what = what;
  if (!l.ready) {
    l.waiting.push_back(std::move(p));
    return Status::ok();
  }
  return issue(l, std::move(p));
}

Status DeviceNcclPeers::joined(int peer, const void* id_bytes) {
  Link& l = link(peer, /*receiving=*/true);
  if (l.has_id) {
    return common::internalError("malformed point-to-point frame: rank " + std::to_string(peer) +
                                 " sent a second NCCL unique id");
  }
  std::memcpy(l.id.internal, id_bytes, sizeof(l.id.internal));
  l.has_id = true;
  l.device = deviceOf(peer);
  if (l.device >= 0) startSetup(l);  // C: else once a receive names a device
  return Status::ok();
}

void DeviceNcclPeers::useDevice(int peer, int device) {
  if (device < 0 || devices_.count(peer) != 0) return;
  devices_[peer] = device;
  auto it = links_.find({peer, true});
  if (it == links_.end() || !it->second.has_id || it->second.started) return;
  it->second.device = device;
  startSetup(it->second);
}

int DeviceNcclPeers::deviceOf(int peer) const {
  auto it = devices_.find(peer);
  return it == devices_.end() ? -1 : it->second;
}

Status DeviceNcclPeers::arrived(int peer, uint64_t bytes, const std::string& what,
                                uint64_t* slot) {
  Link& l = link(peer, /*receiving=*/true);
  if (!l.has_id) {
    return common::internalError("malformed point-to-point frame: rank " + std::to_string(peer) +
                                 " sent a CUDA tensor by NCCL before its NCCL unique id");
  }
  *slot = next_slot_++;
  Pending p;
  p.id = *slot;
  p.bytes = bytes;
  p.what = what;
  if (!l.ready) {
    l.waiting.push_back(std::move(p));
    return Status::ok();
  }
  nccl::DeviceRestorer restore;
  return issue(l, std::move(p));
}

// B and D: on the pair's stream, in the order submitted (sends) or arrived (receives).
Status DeviceNcclPeers::issue(Link& l, Pending p) {
  HVD_RETURN_IF_ERROR(l.stream->select());
  Transfer t;
  t.link = &l;
  t.id = p.id;
  t.what = p.what;
  if (l.receiving) {
    void* block = nullptr;
    size_t capacity = 0;
    HVD_RETURN_IF_ERROR(DeviceOutputPool::instance().take(p.bytes, *l.stream, &block, &capacity));
    t.output = pooledDeviceOutput(block, p.bytes, l.device, capacity);
    HVD_RETURN_IF_ERROR(l.comm->recv(block, p.bytes, 0));
  } else {
    if (p.ready.get() != nullptr) HVD_RETURN_IF_ERROR(l.stream->waitFor(p.ready.get()));
    p.ready.reset();
    HVD_RETURN_IF_ERROR(l.comm->send(p.data, p.bytes, 1));
  }
  HVD_RETURN_IF_ERROR(l.stream->record(&t.done));
  const Status woken = wake_.notifyAfter(*l.stream);
  if (!woken.isOk()) {
    l.stream->release(t.done);
    return woken;
  }
  t.since = std::chrono::steady_clock::now();
  transfers_.push_back(std::move(t));
  return Status::ok();
}

Status DeviceNcclPeers::pollSetups() {
  for (auto& [key, l] : links_) {
    if (!l.started || l.ready) continue;
    bool done = false;
    Status status = l.failure.isOk() ? l.comm->pollSetup(&done) : l.failure;
    if (status.isOk() && !done) continue;
    --setting_up_;
    const std::string op = !l.waiting.empty() ? l.waiting.front().what
                           : (l.receiving ? "recv from rank " : "send to rank ") +
                                 std::to_string(l.peer);
    if (!status.isOk()) {
      return Status(status.code(), op + ": NCCL set-up with rank " + std::to_string(l.peer) +
                                       " failed: " + status.message());
    }
    l.ready = true;
    while (!l.waiting.empty()) {
      Pending p = std::move(l.waiting.front());
      l.waiting.pop_front();
      HVD_RETURN_IF_ERROR(issue(l, std::move(p)));
    }
  }
  return Status::ok();
}

Status DeviceNcclPeers::poll(std::vector<Done>* done) {
  if (!busy()) return Status::ok();
  nccl::DeviceRestorer restore;
  if (setting_up_ > 0) HVD_RETURN_IF_ERROR(pollSetups());
  const auto now = std::chrono::steady_clock::now();
  for (auto it = transfers_.begin(); it != transfers_.end();) {
    Transfer& t = *it;
    bool finished = false;
    HVD_RETURN_IF_ERROR(t.link->stream->select());
    HVD_RETURN_IF_ERROR(t.link->stream->query(t.done, &finished));
    if (!finished) {
      HVD_RETURN_IF_ERROR(t.link->comm->asyncError());
      if (std::chrono::duration<double>(now - t.since).count() > timeout_seconds_) {
        common::Text text;
        text << t.what << ": its NCCL transfer did not finish in " << timeout_seconds_
             << " s (HVD_TIMEOUT): rank " << t.link->peer << " stopped or never "
             << (t.link->receiving ? "sent it" : "received it") << ", or the kernel that "
             << "produces the tensor still runs";
        return common::timedOut(text.str());
      }
      ++it;
      continue;
    }
    t.link->stream->release(t.done);
    done->push_back(Done{t.id, t.link->receiving, t.link->peer, std::move(t.output)});
    it = transfers_.erase(it);
  }
  return Status::ok();
}

Status DeviceNcclPeers::handOver(uint64_t slot, int64_t consumer,
                                 std::shared_ptr<OutputBuffer>* output) {
  auto t = std::find_if(transfers_.begin(), transfers_.end(), [slot](const Transfer& x) {
    return x.link->receiving && x.id == slot;
  });
  if (t == transfers_.end()) return Status::ok();  // waits for the pair's set-up: not queued
  nccl::DeviceRestorer restore;
  HVD_RETURN_IF_ERROR(t->link->stream->select());
  HVD_RETURN_IF_ERROR(t->link->stream->check(
      nccl::cudaApi()->streamWaitEvent(reinterpret_cast<nccl::CudaStream>(consumer), t->done, 0),
      "cudaStreamWaitEvent (the receive's consumer stream on the tensor's ncclRecv)"));
  t->output->release_stream = static_cast<uintptr_t>(consumer);  // its users run there
  *output = t->output;  // (the transfer keeps it too, until its ncclRecv ran)
  return Status::ok();
}

Status DeviceNcclPeers::toHost(const OutputBuffer& device_bytes,
                               std::shared_ptr<OutputBuffer>* host) {
  nccl::DeviceRestorer restore;
  *host = hostOutput(device_bytes.bytes);
  if (!*host || (*host)->data == nullptr) {
    return common::internalError("no host memory for " + std::to_string(device_bytes.bytes) +
                                 " bytes");
  }
  nccl::DeviceStream* stream = nullptr;
  HVD_RETURN_IF_ERROR(host_copies_.get(device_bytes.device, &stream));
  HVD_RETURN_IF_ERROR(stream->copy((*host)->data, device_bytes.data, device_bytes.bytes));
  return stream->synchronize();  // the bytes are final: only this copy runs
}

void DeviceNcclPeers::abandon() {
  nccl::DeviceRestorer restore;
  for (auto& [key, l] : links_) {
    if (l.comm) l.comm->abort();  // F: a transfer waiting on the peer returns
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  bool drained = true;
  for (auto& [key, l] : links_) {
    if (l.stream && l.stream->select().isOk()) drained = l.stream->drain(deadline) && drained;
  }
  if (!drained) {  // F: a stuck transfer may still write its output or use its stream
    static std::mutex mutex;
    static auto* streams = new std::vector<std::unique_ptr<nccl::DeviceStream>>();  // until exit
    for (Transfer& t : transfers_) keepUntilExit(std::move(t.output));
    std::lock_guard<std::mutex> lock(mutex);
    for (auto& [key, l] : links_) {
      l.comm.reset();  // aborted: nothing left to destroy
      if (l.stream) streams->push_back(std::move(l.stream));  // never freed under its work
    }
  }
  transfers_.clear();
  links_.clear();
  devices_.clear();
  setting_up_ = 0;
}

}  // namespace hvd::runtime
