// The env table: every HVD_* knob with its type, default, Horovod alias and doc, read once at
// init (Config::fromEnvironment) on the calling thread. A bad value warns once and names the
// value used instead. Python reads the same table through the binding (engine_native.config).
// Tunable knobs (fusion threshold, cycle time, cache capacity, hierarchical allreduce) also
// record whether the user set them: autotune keeps user-set knobs fixed (Horovod's rule).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hvd::common {

struct Config {
  double timeout_seconds = 30.0;            // HVD_TIMEOUT: no progress from a peer for this long -> error
  double stall_check_seconds = 60.0;        // HVD_STALL_CHECK_TIME (HOROVOD_STALL_CHECK_TIME_SECONDS)
  bool stall_check_disable = false;         // HVD_STALL_CHECK_DISABLE
  // HVD_STALL_SHUTDOWN_TIME (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS): deadlocked ops fail after
  // this long; 0 never, < 0 (default) kStallShutdownChecks x stall_check_seconds.
  double stall_shutdown_seconds = 0.0;
  int64_t fusion_threshold_bytes = 128ll << 20;  // HVD_FUSION_THRESHOLD (HOROVOD_FUSION_THRESHOLD)
  double cycle_time_ms = 1.0;               // HVD_CYCLE_TIME_MS (HOROVOD_CYCLE_TIME)
  int64_t cache_capacity = 1024;            // HVD_CACHE_CAPACITY (HOROVOD_CACHE_CAPACITY)
  std::string transport = "auto";           // HVD_TRANSPORT: auto | tcp | shm
  std::string cpu_bind = "auto";  // HVD_CPU_BIND: none | auto | core (Note [CPU binding])
  std::string gpu_path = "auto";            // HVD_GPU_PATH: auto | nccl | ipc | staged
  std::string ipc_order = "host";           // HVD_IPC_ORDER: host | device
  bool hierarchical_allreduce = false;      // HVD_HIERARCHICAL_ALLREDUCE
  int64_t spin_microseconds = 20;           // HVD_SPIN_US: bounded spin before a blocking wait
  int64_t caller_spin_microseconds = 200;   // HVD_CALLER_SPIN_US (Note [Caller drives])
  int64_t p2p_split_min_bytes = 1 << 20;  // HVD_P2P_SPLIT_MIN_BYTES (transport/peer_split.cc)
  int64_t one_round_bytes = 4096;  // HVD_ONE_ROUND_BYTES (Note [One round] in runtime/one_round.cc)
  int64_t p2p_spin_max_microseconds = 2000;  // HVD_P2P_SPIN_MAX_US (runtime/core_headroom.cc)
  int64_t shm_ring_bytes = 4ll << 20;       // HVD_SHM_RING_BYTES: per directed pair
  std::string single_copy = "auto";         // HVD_SINGLE_COPY: auto | on | off (cross-memory reads)
  int64_t single_copy_min_bytes = 16ll << 20;  // HVD_SINGLE_COPY_MIN_BYTES (the leader's counts)
  bool shared_outputs = true;               // HVD_SHARED_OUTPUTS: peers write into outputs
  int64_t tcp_segment_bytes = 1ll << 20;    // HVD_TCP_SEGMENT_BYTES: pipelining unit on TCP
  std::string timeline_path;                // HVD_TIMELINE (HOROVOD_TIMELINE), "DYNAMIC" allowed
  bool timeline_mark_cycles = false;        // HVD_TIMELINE_MARK_CYCLES
  bool timeline_live = true;                // HVD_TIMELINE_LIVE: feed the dashboard's strip
  bool autotune = false;                    // HVD_AUTOTUNE (HOROVOD_AUTOTUNE)
  std::string autotune_log;                 // HVD_AUTOTUNE_LOG: CSV written by rank 0
  int64_t autotune_warmup_samples = 3;      // HVD_AUTOTUNE_WARMUP_SAMPLES
  int64_t autotune_steps_per_sample = 10;   // HVD_AUTOTUNE_STEPS_PER_SAMPLE
  int64_t autotune_bayes_opt_max_samples = 20;      // HVD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES
  double autotune_gaussian_process_noise = 0.8;     // HVD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE

  // NCCL's own NCCL_MULTI_RANK_GPU_ENABLE (an integer, as NCCL parses it), read here once so
  // every member's path choice describes it (Note [Device path choice] F); not an HVD knob.
  bool nccl_multi_rank_gpu = false;

  // Set by fromEnvironment when the variable (or its alias) held a valid value.
  bool fusion_threshold_set = false;
  bool cycle_time_set = false;
  bool cache_capacity_set = false;
  bool hierarchical_allreduce_set = false;

  static Config fromEnvironment();
};

struct ConfigEntry {
  const char* name;       // HVD_ name
  const char* alias;      // HOROVOD_ name or nullptr
  const char* type;       // "float" | "int" | "bool" | "string" | "bytes"
  const char* default_value;
  const char* doc;
};

// The table itself: engine_native.config_table(), docs/pages/configuration.md.
const std::vector<ConfigEntry>& configTable();

}  // namespace hvd::common
