// Rank 0's side of negotiation (rank_zero_coordinator.h): admitting requests (with the
// timeline's NEGOTIATE_<OP> spans), releasing what is ready into the batching window, the
// process sets the coordinator knows and the autotune setting in force. Background thread
// only. The order of a coordinator step is written at BackgroundLoop::coordinate().
#include "runtime/rank_zero_coordinator.h"

#include <algorithm>

#include "common/logging.h"

namespace hvd::runtime {

using common::Status;

RankZeroCoordinator::RankZeroCoordinator(int world_size, coord::KeyTable& keys,
                                         ProcessSetTable& sets, const common::Config& config,
                                         Autotuner* autotuner)
    : keys_(keys), sets_(sets), config_(config), autotuner_(autotuner),
      coordinator_(world_size, keys),
      window_(names_, config.fusion_threshold_bytes, config.cycle_time_ms),
      cache_enabled_(config.cache_capacity > 0) {
  coordinator_.setFusionThreshold(config.fusion_threshold_bytes);
  coordinator_.setCacheCapacity(config_.cache_capacity);
  for (int r = 1; r < world_size; ++r) {
    mirrors_[r] = std::make_unique<coord::RequestCache>(config_.cache_capacity);
  }
}

void RankZeroCoordinator::syncProcessSets() {
  uint64_t version = sets_.version();
  if (version == sets_version_) return;
  sets_version_ = version;
  auto snapshot = sets_.snapshot();
  for (auto it = registered_sets_.begin(); it != registered_sets_.end();) {
    if (snapshot.count(*it) == 0) {
      coordinator_.removeProcessSet(*it);  // drops its pending names: so do we
      for (NameState& state : names_) {
        if (state.negotiating < 0 || keys_.set(state.key) != *it) continue;
        if (state.negotiating == static_cast<int8_t>(coord::OpType::kAllreduce)) {
          --negotiating_allreduces_;
        }
        state.negotiating = -1;
        --negotiating_;
      }
      it = registered_sets_.erase(it);
    } else {
      ++it;
    }
  }
  coordinates_other_sets_ = false;
  for (const auto& [id, members] : snapshot) {
    if (registered_sets_.insert(id).second) coordinator_.addProcessSet({id, members});
    coordinates_other_sets_ = coordinates_other_sets_ ||
                              std::find(members.begin(), members.end(), 0) == members.end();
  }
}

void RankZeroCoordinator::adoptTunedParams() {
  if (autotuner_ == nullptr) return;
  std::optional<coord::ParamsUpdate> update = autotuner_->takePending();
  if (!update) return;
  coordinator_.setFusionThreshold(update->fusion_threshold_bytes);
  window_.setParams(update->fusion_threshold_bytes, update->cycle_time_ms);
  if (update->cache_enabled != cache_enabled_) {
    cache_enabled_ = update->cache_enabled;
    const int64_t capacity = config_.cache_capacity > 0 ? config_.cache_capacity : 1024;
    coordinator_.setCacheCapacity(cache_enabled_ ? capacity : 0);
  }
  unsent_params_ = update;  // a newer setting replaces one not sent yet: no rank applied it
}

NameState& RankZeroCoordinator::nameState(coord::Key key) {
  if (key.index >= names_.size()) names_.resize(std::max<size_t>(key.index + 1, 64));
  NameState& state = names_[key.index];
  if (state.key != key) state = NameState{key, -1, 0, 0};  // a new name in a reused slot
  return state;
}

// One request into the coordinator (timeline, while a file is written: NEGOTIATE_<OP> opens at
// a name's first arrival, one rank tick per arrival). A worker may register a new set (and use
// it) a moment before rank 0 does: its requests wait in parked_ until rank 0's own
// add_process_set lands.
void RankZeroCoordinator::admit(coord::Key key, const coord::Request& request, int32_t rank,
                                timeline::Timeline* timeline, Clock::time_point now) {
  if (registered_sets_.count(request.process_set) == 0) {
    parked_.push_back(request);
    parked_.back().request_rank = rank;
    parked_.back().key = key;
    return;
  }
  Status status = coordinator_.add(key, request, rank, now);
  if (!status.isOk()) {
    HVD_LOG(kWarning, "coord") << "rejected request '" << keys_.name(key) << "' from rank " << rank
                               << ": " << status.message();
    return;
  }
  if (request.type == coord::OpType::kJoin) return;  // joins are not timed (Horovod)
  if (request.type == coord::OpType::kAllreduce) window_.noteArrival(now);
  NameState& state = nameState(key);
  if (state.negotiating < 0) {
    state.negotiating = static_cast<int8_t>(request.type);
    ++negotiating_;
    if (request.type == coord::OpType::kAllreduce) ++negotiating_allreduces_;
    if (timeline != nullptr) {
      timeline->negotiateStart(keys_.name(key), coord::opTypeName(request.type));
    }
  }
  if (timeline != nullptr) timeline->negotiateRankReady(keys_.name(key), rank);
}

// Requests are admitted as they are decoded: a repeated one comes from the mirror with its
// key hint, so the steady state interns nothing.
Status RankZeroCoordinator::admitRequests(int from, const std::string& payload,
                                          timeline::Timeline* timeline, Clock::time_point now) {
  return coord::decodeRequests(
      payload, mirrors_[from].get(),
      [&](const coord::Request& request, int32_t, int32_t, coord::Key* hint) {
        coord::Key key = hint != nullptr && keys_.live(*hint)
                             ? *hint
                             : keys_.intern(request.process_set, request.name);
        if (hint != nullptr) *hint = key;
        if (!key.assigned()) return;  // 4 Mi names: the stall inspector will show it
        admit(key, request, from, timeline, now);
      });
}

void RankZeroCoordinator::admitParked(timeline::Timeline* timeline) {
  if (parked_.empty()) return;
  timeline::ClockScope one_clock_read(timeline);
  const auto now = Clock::now();
  std::vector<coord::Request> parked;
  parked.swap(parked_);
  for (const auto& request : parked) {
    admit(request.key, request, request.request_rank, timeline, now);  // may park it again
  }
}

void RankZeroCoordinator::release(Clock::time_point now, timeline::Timeline* timeline) {
  std::vector<coord::Response> ready = coordinator_.takeReady();
  if (ready.empty()) return;
  noteReleased(ready, timeline);
  window_.add(std::move(ready), now);
}

void RankZeroCoordinator::noteReleased(const std::vector<coord::Response>& ready,
                                       timeline::Timeline* timeline) {
  timeline::ClockScope one_clock_read(timeline);  // released together
  for (const auto& r : ready) {
    for (coord::Key key : r.keys) {
      NameState& state = nameState(key);
      if (r.type == coord::OpType::kAllreduce) window_.noteStepRelease(state);
      if (state.negotiating < 0) continue;  // a join's name
      if (state.negotiating == static_cast<int8_t>(coord::OpType::kAllreduce)) {
        --negotiating_allreduces_;
      }
      state.negotiating = -1;
      --negotiating_;
      if (timeline != nullptr) timeline->negotiateEnd(keys_.name(key));
    }
  }
}

std::vector<coord::Response> RankZeroCoordinator::takeBatch(
    std::optional<coord::ParamsUpdate>* params) {
  std::vector<coord::Response> ready = window_.take();
  *params = std::move(unsent_params_);
  unsent_params_.reset();
  return ready;
}

void RankZeroCoordinator::markKeys(const coord::KeyTable::MarkFn& mark) const {
  coordinator_.markKeys(mark);
  for (const auto& r : parked_) mark(r.key);
  for (const auto& state : names_) {
    // Negotiating names, and the last two steps' names: the step memory (Note [Batching
    // window]) must still know them when they come round again.
    if (state.negotiating >= 0 || window_.remembers(state)) mark(state.key);
  }
  for (const auto& r : window_.responses()) {
    for (coord::Key key : r.keys) mark(key);
  }
}

}  // namespace hvd::runtime
