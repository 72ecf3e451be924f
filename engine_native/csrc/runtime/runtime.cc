#include "runtime/runtime.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <numeric>
#include <set>

#include "common/logging.h"

namespace hvd::runtime {

using common::Status;
using coord::OpType;

namespace {

constexpr const char* kNotInitialized = "Horovod has not been initialized; use hvd.init().";

}  // namespace

Runtime& Runtime::instance() {
  static Runtime runtime;
  return runtime;
}

Runtime::~Runtime() {
  if (loop_) loop_->shutdown();
}

Status Runtime::listen(const std::string& bind_address, int* port) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (loop_) return common::invalidArgument("listen(): the core is already initialised");
  mesh_ = std::make_unique<transport::Mesh>();
  return mesh_->listen(bind_address, port);
}

Status Runtime::init(int rank, const std::vector<transport::PeerInfo>& peers,
                     const std::string& secret, const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (loop_) return Status::ok();  // repeated init is a no-op, as in Horovod
  if (!mesh_) return common::invalidArgument("init(): call listen() first");
  if (rank < 0 || rank >= static_cast<int>(peers.size())) {
    return common::invalidArgument("init(): rank " + std::to_string(rank) + " outside [0, " +
                                   std::to_string(peers.size()) + ")");
  }
  config_ = common::Config::fromEnvironment();
  common::setLogRank(rank);
  Status status = mesh_->connect(rank, peers, secret, job_id, config_);
  if (!status.isOk()) {
    mesh_.reset();
    return status;
  }
  std::string not_bound;
  std::vector<common::CpuRanges> host_cpus;  // Note [CPU binding] J
  for (int r : mesh_->hostRanks()) host_cpus.push_back(peers[r].cpus);
  const BindMode mode = bindModeOf(config_.cpu_bind);
  const CpuBinding binding =
      bindRank(mode, maskGroupOf(host_cpus, static_cast<size_t>(mesh_->hostIndexOf(rank))),
               mesh_->cpusCrowded(), &not_bound);
  const std::string bind_note = "HVD_CPU_BIND=" + config_.cpu_bind + ": " + not_bound;
  if (!not_bound.empty() && mode == BindMode::kAuto) HVD_LOG(kInfo, "runtime") << bind_note;
  if (!not_bound.empty() && mode != BindMode::kAuto) HVD_LOG(kWarning, "runtime") << bind_note;
  rank_ = rank;
  size_ = static_cast<int>(peers.size());
  sets_.reset(size_);
  set_devices_.clear();
  metrics_.reset();
  std::set<std::string> hosts;
  for (const auto& peer : peers) hosts.insert(peer.host_id);
  timeline_ = std::make_shared<timeline::Timeline>();
  timeline_->setLiveCapture(config_.timeline_live);
  startTimelineAtInit();
  autotuner_ = std::make_shared<Autotuner>(config_, rank_, static_cast<int>(hosts.size()));
  loop_ = std::make_shared<BackgroundLoop>(*mesh_, handles_, sets_, metrics_, config_,
                                           timeline_.get(), autotuner_.get(), binding);
  loop_->setTimelineDetail(timeline_->stats().file_open);
  metrics_.setCpuBinding(binding.cpus);
  loop_->start();
  HVD_LOG(kInfo, "runtime") << "initialised: rank " << rank_ << " of " << size_;
  return Status::ok();
}

// HVD_TIMELINE (HOROVOD_TIMELINE) = path: rank 0 writes it from init on; DYNAMIC: nothing
// until start_timeline(). A file that cannot be opened is a warning, never an init failure.
void Runtime::startTimelineAtInit() {
  std::string mode;
  for (char c : config_.timeline_path) {
    mode += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  if (rank_ != 0 || config_.timeline_path.empty() || mode == "DYNAMIC") return;
  Status status = timeline_->start(config_.timeline_path, config_.timeline_mark_cycles);
  if (!status.isOk()) {
    HVD_LOG(kWarning, "timeline") << "HVD_TIMELINE: " << status.message()
                                  << "; the timeline is off (start_timeline() can start it)";
  }
}

void Runtime::shutdown() {
  std::shared_ptr<BackgroundLoop> loop;
  std::unique_ptr<transport::Mesh> mesh;
  std::shared_ptr<timeline::Timeline> timeline;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    loop = std::move(loop_);
    mesh = std::move(mesh_);
    timeline = std::move(timeline_);
    rank_ = -1;
    size_ = 0;
  }
  if (loop) loop->shutdown();  // outside the lock: enqueue() may be waiting on it
  loop.reset();
  if (timeline) timeline->stop();  // after the loop: it was the only recorder
  timeline.reset();
  if (mesh) mesh->close();
}

Status Runtime::startTimeline(const std::string& path, bool mark_cycles) {
  std::shared_ptr<timeline::Timeline> timeline;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!loop_) return common::invalidArgument(std::string(kNotInitialized));
    if (rank_ != 0) return Status::ok();
    timeline = timeline_;
  }
  if (path.empty()) return common::invalidArgument("start_timeline(): file_path is empty");
  Status status = timeline->start(path, mark_cycles);
  std::lock_guard<std::mutex> lock(mutex_);
  if (loop_ && timeline_ == timeline) loop_->setTimelineDetail(status.isOk());
  return status;
}

Status Runtime::stopTimeline() {
  std::shared_ptr<timeline::Timeline> timeline;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!loop_) return common::invalidArgument(std::string(kNotInitialized));
    loop_->setTimelineDetail(false);
    timeline = timeline_;
  }
  if (timeline) timeline->stop();
  return Status::ok();
}

timeline::TimelineStats Runtime::timelineStats() const {
  std::shared_ptr<timeline::Timeline> timeline;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    timeline = timeline_;
  }
  return timeline ? timeline->stats() : timeline::TimelineStats();
}

std::vector<timeline::RecentEvent> Runtime::timelineEvents(int64_t since_us) const {
  std::shared_ptr<timeline::Timeline> timeline;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    timeline = timeline_;
  }
  if (!timeline) return {};
  return timeline->recentEvents(since_us);
}

std::optional<AutotuneReport> Runtime::autotuneReport() const {
  std::shared_ptr<Autotuner> autotuner;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    autotuner = autotuner_;
  }
  if (!autotuner) return std::nullopt;
  return autotuner->report();
}

Status Runtime::setAutotune(bool enabled) {
  std::shared_ptr<Autotuner> autotuner;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!loop_) return common::invalidArgument(std::string(kNotInitialized));
    autotuner = autotuner_;
  }
  autotuner->setEnabled(enabled);
  return Status::ok();
}

Status Runtime::setTunedParams(const autotune::TunedParams& params) {
  if (params.fusion_threshold_bytes < 0 || !(params.cycle_time_ms >= 0) ||
      params.cycle_time_ms > 1e6) {
    return common::invalidArgument("set_tuned_params(): fusion threshold must be >= 0 and "
                                   "cycle time in [0, 1e6] ms");
  }
  std::shared_ptr<Autotuner> autotuner;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!loop_) return common::invalidArgument(kNotInitialized);
    autotuner = autotuner_;
  }
  autotuner->setParams(params);
  return Status::ok();
}

void Runtime::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (loop_) loop_->abort(reason);
}

Status Runtime::failure() const {
  std::shared_ptr<BackgroundLoop> loop;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    loop = loop_;
  }
  return loop ? loop->failure() : Status::ok();
}

bool Runtime::initialized() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return loop_ != nullptr;
}

int Runtime::rank() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return rank_;
}

int Runtime::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return size_;
}

Status Runtime::submitLocked(TensorEntry* entries, const std::string_view* names, size_t count,
                             bool wake) {
  if (!loop_) return common::invalidArgument(kNotInitialized);
  for (size_t i = 0; i < count; ++i) {
    entries[i].request.request_rank = rank_;
    HVD_RETURN_IF_ERROR(validate(&entries[i].request, names[i]));
  }
  for (size_t i = 0; i < count; ++i) {
    HVD_RETURN_IF_ERROR(checkDevice(&entries[i].request, names[i]));
  }
  for (size_t i = 0; i < count; ++i) {
    HVD_RETURN_IF_ERROR(checkNotCapturing(entries[i], names[i]));
  }
  for (size_t i = 0; i < count; ++i) {  // Note [Stream ordering] in nccl/device_stream.h
    HVD_RETURN_IF_ERROR(recordReady(&entries[i]));
  }
  // submit() creates the handles, which hold the names (Note [Name lifetime]).
  return loop_->submit(entries, names, count, wake);
}

Status Runtime::enqueue(EnqueueArgs&& op, int64_t* handle, bool wake) {
  TensorEntry entry;
  entry.request = std::move(op.request);
  entry.input = op.input;
  entry.output = op.output;
  entry.output_bytes = op.output_bytes;
  entry.stream = op.stream;
  std::lock_guard<std::mutex> lock(mutex_);
  HVD_RETURN_IF_ERROR(submitLocked(&entry, &op.name, 1, wake));
  *handle = entry.handle;
  return Status::ok();
}

Status Runtime::enqueue(std::vector<EnqueueArgs> ops, std::vector<int64_t>* handles,
                        bool wake) {
  std::vector<TensorEntry> entries(ops.size());
  std::vector<std::string_view> names(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    entries[i].request = std::move(ops[i].request);
    entries[i].input = ops[i].input;
    entries[i].output = ops[i].output;
    entries[i].output_bytes = ops[i].output_bytes;
    entries[i].stream = ops[i].stream;
    names[i] = ops[i].name;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  HVD_RETURN_IF_ERROR(submitLocked(entries.data(), names.data(), entries.size(), wake));
  handles->clear();
  for (const auto& e : entries) handles->push_back(e.handle);
  return Status::ok();
}

std::shared_ptr<BackgroundLoop> Runtime::liveLoop() {
  std::lock_guard<std::mutex> lock(mutex_);
  return loop_;
}

bool Runtime::drive(int64_t handle) {
  const std::shared_ptr<BackgroundLoop> loop = liveLoop();
  return loop && loop->drive(handle);
}

bool Runtime::awaitDevice(int64_t handle, int slice_ms,
                          std::chrono::steady_clock::time_point since) {
  const std::shared_ptr<BackgroundLoop> loop = liveLoop();
  return loop && loop->awaitDevice(handle, std::chrono::milliseconds(slice_ms), since);
}

bool Runtime::awaitPeer(int64_t handle, int slice_ms) {
  const std::shared_ptr<BackgroundLoop> loop = liveLoop();
  return loop && loop->awaitPeer(handle, std::chrono::milliseconds(slice_ms));
}

Status Runtime::send(PeerSend send, bool wait_now, int64_t* handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!loop_) return common::invalidArgument(std::string(kNotInitialized));
  return loop_->submitSend(std::move(send), wait_now, handle);
}

Status Runtime::recv(const PeerRecv& recv, bool wait_now, int64_t* handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!loop_) return common::invalidArgument(std::string(kNotInitialized));
  return loop_->submitRecv(recv, wait_now, handle);
}

std::string Runtime::peerCudaRoute(int peer) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return loop_ ? loop_->peerCudaRoute(peer) : "";
}

Status Runtime::addProcessSet(std::vector<int> ranks, int32_t* id) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!loop_) return common::invalidArgument(kNotInitialized);
  std::sort(ranks.begin(), ranks.end());
  if (ranks.empty() || std::adjacent_find(ranks.begin(), ranks.end()) != ranks.end() ||
      ranks.front() < 0 || ranks.back() >= size_) {
    return common::invalidArgument("add_process_set(): ranks must be distinct and within [0, " +
                                   std::to_string(size_) + ")");
  }
  *id = sets_.add(std::move(ranks));
  loop_->processSetsChanged();
  return Status::ok();
}

Status Runtime::removeProcessSet(int32_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!sets_.remove(id)) {
    return common::invalidArgument("remove_process_set(): process set " + std::to_string(id) +
                                   " is not registered (the global set cannot be removed)");
  }
  if (loop_) loop_->processSetsChanged();
  return Status::ok();
}

std::optional<std::vector<int>> Runtime::processSetRanks(int32_t id) const {
  return sets_.members(id);
}

}  // namespace hvd::runtime
