// The env table (common/config.h). One table, kKnobs, drives both parsing and documentation:
// each row names the HVD_ variable, its Horovod alias, its type, its default, its doc and the
// Config field it sets. A bad value warns once per (variable, value) and keeps the default.
#include "common/config.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "common/logging.h"

namespace hvd::common {
namespace {

enum class Kind { kFloat, kInt, kBytes, kBool, kString, kDocOnly };

// Where a knob lands in Config, and the smallest value it accepts.
struct Knob {
  ConfigEntry entry;
  Kind kind;
  double Config::*float_field;
  int64_t Config::*int_field;
  bool Config::*bool_field;
  std::string Config::*string_field;
  double minimum;
  bool Config::*set_flag;  // records "the user set this knob" (tunable knobs only)
};

Knob floatKnob(ConfigEntry e, double Config::*f, double minimum) {
  return Knob{e, Kind::kFloat, f, nullptr, nullptr, nullptr, minimum, nullptr};
}
Knob intKnob(ConfigEntry e, Kind kind, int64_t Config::*f, double minimum) {
  return Knob{e, kind, nullptr, f, nullptr, nullptr, minimum, nullptr};
}
Knob boolKnob(ConfigEntry e, bool Config::*f) {
  return Knob{e, Kind::kBool, nullptr, nullptr, f, nullptr, 0, nullptr};
}
Knob stringKnob(ConfigEntry e, std::string Config::*f) {
  return Knob{e, Kind::kString, nullptr, nullptr, nullptr, f, 0, nullptr};
}
Knob docKnob(ConfigEntry e) {
  return Knob{e, Kind::kDocOnly, nullptr, nullptr, nullptr, nullptr, 0, nullptr};
}

// A knob autotune may search unless the user set it.
Knob tunable(Knob knob, bool Config::*set_flag) {
  knob.set_flag = set_flag;
  return knob;
}

// Defaults here must equal the initialisers in common/config.h (checked by the unit tests).
const std::vector<Knob>& knobs() {
  static const std::vector<Knob> kKnobs = {
      floatKnob({"HVD_TIMEOUT", nullptr, "float", "30",
                 "Seconds without progress from a peer before a collective fails naming it; "
                 "also bounds connecting the mesh."},
                &Config::timeout_seconds, 0.001),
      floatKnob({"HVD_STALL_CHECK_TIME", "HOROVOD_STALL_CHECK_TIME_SECONDS", "float", "60",
                 "Seconds a tensor may wait for other ranks before the stall inspector warns."},
                &Config::stall_check_seconds, 0.001),
      boolKnob({"HVD_STALL_CHECK_DISABLE", "HOROVOD_STALL_CHECK_DISABLE", "bool", "false",
                "Turn the stall inspector's warning off (not the deadlock shutdown)."},
               &Config::stall_check_disable),
      floatKnob({"HVD_STALL_SHUTDOWN_TIME", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "float", "0",
                 "Seconds after which ops that can never complete (every rank they wait for "
                 "is itself blocked on other tensors: diverging op sequences) fail on every "
                 "rank with a report of what each rank waits for. 0 (default): never, as "
                 "Horovod; negative: 4 x HVD_STALL_CHECK_TIME."},
                &Config::stall_shutdown_seconds, -1e300),
      tunable(intKnob({"HVD_FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHOLD", "bytes", "134217728",
                       "Fusion buffer size in bytes (suffixes K, M, G accepted); 0 disables "
                       "fusion. Set explicitly, autotune leaves it fixed."},
                      Kind::kBytes, &Config::fusion_threshold_bytes, 0),
              &Config::fusion_threshold_set),
      tunable(floatKnob({"HVD_CYCLE_TIME_MS", "HOROVOD_CYCLE_TIME", "float", "1",
                         "Batching window in milliseconds: rank 0 holds ready tensors while "
                         "others keep arriving less than this apart (a step seen before: until "
                         "it is complete), at most 5 windows, so they fuse; also the longest "
                         "a rank's loop with work in flight naps before taking new "
                         "submissions (a waiting caller ends the nap). Never a latency floor "
                         "for a lone tensor. Set explicitly, autotune leaves it fixed."},
                        &Config::cycle_time_ms, 0),
              &Config::cycle_time_set),
      tunable(intKnob({"HVD_CACHE_CAPACITY", "HOROVOD_CACHE_CAPACITY", "int", "1024",
                       "Response cache entries; 0 disables the cache. Set explicitly, autotune "
                       "leaves it fixed."},
                      Kind::kInt, &Config::cache_capacity, 0),
              &Config::cache_capacity_set),
      stringKnob({"HVD_TRANSPORT", nullptr, "string", "auto",
                  "auto (shm between ranks of one host, tcp between hosts), tcp (tcp "
                  "everywhere), or shm (same as auto)."},
                 &Config::transport),
      stringKnob({"HVD_CPU_BIND", nullptr, "string", "auto",
                  "core: each rank of a host runs on its own share of the host's CPUs (CPUs "
                  "/ ranks of the host, contiguous), every thread of the process; where the "
                  "ranks outnumber the CPUs, on one CPU that ranks / CPUs of them share "
                  "(hvdrun --bind-to core); ranks a launcher gave the same CPUs, which no "
                  "other rank of the host may use, split those among themselves. auto (the "
                  "default): only that last case, where such ranks outnumber their CPUs by a "
                  "whole multiple (4 on 2). none: never."},
                 &Config::cpu_bind),
      stringKnob({"HVD_GPU_PATH", nullptr, "string", "auto",
                  "How CUDA collectives move between ranks: auto (NCCL when every member of "
                  "a process set has its own GPU and NCCL loads, CUDA IPC with reductions on "
                  "the device when they all share one GPU, else the staged path through host "
                  "memory and shm/tcp), nccl or ipc (fail instead of staging), or staged."},
                 &Config::gpu_path),
      stringKnob({"HVD_IPC_ORDER", nullptr, "string", "host",
                  "How ranks sharing one GPU order their CUDA IPC steps: host (the default: "
                  "an op's first step waits on the host for each rank's own copy before the "
                  "barrier instead of a stream waiting on another process's event; later "
                  "chunks of a large op use events) or device (interprocess events only). "
                  "The set uses host when any member asks for it."},
                 &Config::ipc_order),
      tunable(boolKnob({"HVD_HIERARCHICAL_ALLREDUCE", "HOROVOD_HIERARCHICAL_ALLREDUCE", "bool",
                        "false",
                        "Intra-host reduce, inter-host ring, intra-host broadcast. Set "
                        "explicitly, autotune leaves it fixed."},
                       &Config::hierarchical_allreduce),
              &Config::hierarchical_allreduce_set),
      intKnob({"HVD_SPIN_US", nullptr, "int", "20",
               "Microseconds a waiting rank spins before it blocks (futex/poll)."},
              Kind::kInt, &Config::spin_microseconds, 0),
      intKnob({"HVD_CALLER_SPIN_US", nullptr, "int", "200",
               "Microseconds a thread waiting on an op drives the core itself before it "
               "sleeps, and polls its CUDA op's completion before it naps; where a host's "
               "ranks outnumber its cores, ranks of one machine whose CPUs overlap (fake "
               "hosts, containers) outnumber the CPUs they span, or ranks pinned within its "
               "CPUs outnumber them, it yields the core between passes (0: never spin)."},
              Kind::kInt, &Config::caller_spin_microseconds, 0),
      intKnob({"HVD_P2P_SPIN_MAX_US", nullptr, "int", "2000",
               "Between ranks bound to CPUs of their own (HVD_CPU_BIND=core, no more ranks than "
               "CPUs): a thread waiting on a point-to-point "
               "op whose HVD_CALLER_SPIN_US ran out spins on while the host has a core free, "
               "until this many microseconds from the wait's start (at most 1 s; 0: never)."},
              Kind::kInt, &Config::p2p_spin_max_microseconds, 0),
      intKnob({"HVD_P2P_SPLIT_MIN_BYTES", nullptr, "bytes", "1048576",
               "A point-to-point message between ranks of one host of at least this many "
               "bytes is copied half by each side, straight from the sender's tensor into "
               "the receiver's memory (process_vm_readv/writev), instead of twice through "
               "the ring; a peer that cannot be read goes back to the ring (0: never, and "
               "offers are refused; metrics()['p2p_split_sent'] counts split messages)."},
              Kind::kBytes, &Config::p2p_split_min_bytes, 0),
      intKnob({"HVD_ONE_ROUND_BYTES", nullptr, "bytes", "4096",
               "A blocking CPU collective of the global set (not a group) whose input is at "
               "most this many bytes per rank (at most 8192) agrees and moves its data in one "
               "round among the ranks (shared memory within a host, one message to each rank "
               "off the host's segment), without rank 0's negotiation. The smallest value of any "
               "rank holds; 0 on any "
               "rank, or HVD_STALL_SHUTDOWN_TIME set on any, turns it off for all "
               "(metrics()['one_round_ops'] counts such ops)."},
              Kind::kBytes, &Config::one_round_bytes, 0),
      intKnob({"HVD_SHM_RING_BYTES", nullptr, "bytes", "4194304",
               "Shared-memory ring per directed pair of ranks on one host (at least 4096)."},
              Kind::kBytes, &Config::shm_ring_bytes, 4096),
      stringKnob({"HVD_SINGLE_COPY", nullptr, "string", "auto",
                  "Whether large ops between ranks of one host read peers' inputs straight "
                  "into the output with process_vm_readv, one copy per byte: auto (the "
                  "default) for broadcasts of host memory (not a staged GPU op's pinned "
                  "buffer, nor a step of another collective) where every rank of the host "
                  "would read on two threads (two CPUs per reader, ranks not outnumbering "
                  "cores), 1 for every broadcast, allgather and alltoall, 0 never. The host's "
                  "ranks agree, and probe at start that they can (metrics()['host_copy'] "
                  "says which, and why no more)."},
                 &Config::single_copy),
      intKnob({"HVD_SINGLE_COPY_MIN_BYTES", nullptr, "bytes", "16777216",
               "The smallest transfer between two ranks of one host (a broadcast, an "
               "allgather part, an alltoall block) that takes the single-copy read; smaller "
               "ones copy through the shared segment, faster there (Note [Single-copy "
               "threshold]; under HVD_SINGLE_COPY=auto at least 1 MiB). The host's lowest "
               "rank's value holds for the whole host."},
              Kind::kBytes, &Config::single_copy_min_bytes, 0),
      boolKnob({"HVD_SHARED_OUTPUTS", nullptr, "bool", "true",
                "true: an alltoall or allgather between ranks of one host whose largest "
                "transfer is >= 64 KiB puts each rank's output in shared memory that the other "
                "ranks write their bytes into, one copy per byte, when every rank of the host "
                "can (probed at start; "
                "metrics()['shared_outputs'] says whether, and why not). false: through the "
                "collective segment's slots, two copies per byte."},
               &Config::shared_outputs),
      intKnob({"HVD_TCP_SEGMENT_BYTES", nullptr, "bytes", "1048576",
               "Pipelining unit of collectives over TCP (at least 4096)."},
              Kind::kBytes, &Config::tcp_segment_bytes, 4096),
      stringKnob({"HVD_TIMELINE", "HOROVOD_TIMELINE", "string", "",
                  "Chrome-trace timeline file written by rank 0; DYNAMIC starts it at run "
                  "time."},
                 &Config::timeline_path),
      boolKnob({"HVD_TIMELINE_MARK_CYCLES", "HOROVOD_TIMELINE_MARK_CYCLES", "bool", "false",
                "Add CYCLE_START markers to the timeline."},
               &Config::timeline_mark_cycles),
      boolKnob({"HVD_TIMELINE_LIVE", nullptr, "bool", "true",
                "Keep the last seconds of timeline events in memory for the dashboard strip "
                "(metrics()['events'], timeline_events()); independent of the file."},
               &Config::timeline_live),
      boolKnob({"HVD_AUTOTUNE", "HOROVOD_AUTOTUNE", "bool", "false",
                "Tune fusion threshold, cycle time, response cache and hierarchical "
                "allreduce on rank 0 (Bayesian optimisation, the threshold on a log2 scale with "
                "0 = fusion off at its lower end; then on/off trials, off and on measured "
                "interleaved, 2 settings per knob beyond the Bayesian budget)."},
               &Config::autotune),
      stringKnob({"HVD_AUTOTUNE_LOG", "HOROVOD_AUTOTUNE_LOG", "string", "",
                  "CSV file rank 0 writes: one row per scored setting, the best last."},
                 &Config::autotune_log),
      intKnob({"HVD_AUTOTUNE_WARMUP_SAMPLES", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "int", "3",
               "Samples discarded before tuning starts."},
              Kind::kInt, &Config::autotune_warmup_samples, 0),
      intKnob({"HVD_AUTOTUNE_STEPS_PER_SAMPLE", "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "int", "10",
               "Training steps per sample (a step ends when a tensor name comes round "
               "again); a setting's score is the median of 5 samples."},
              Kind::kInt, &Config::autotune_steps_per_sample, 1),
      intKnob({"HVD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
               "int", "20",
               "Settings of fusion threshold (log2 scale, 16 KiB to the largest, or 0) x cycle "
               "time the Bayesian phase scores, the re-measured finalists included."},
              Kind::kInt, &Config::autotune_bayes_opt_max_samples, 0),
      floatKnob({"HVD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE",
                 "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "float", "0.8",
                 "Noise term of the Gaussian process (standardised scores)."},
                &Config::autotune_gaussian_process_noise, 0),
      docKnob({"HVD_LOG", "HOROVOD_LOG_LEVEL", "string", "warning",
               "Log level: trace, debug, info, warning or error."}),
      docKnob({"HVD_LOG_SUBSYS", nullptr, "string", "",
               "Comma list of subsystems whose trace/debug/info lines are shown (empty = "
               "all); warnings and errors are always shown."}),
  };
  return kKnobs;
}

std::string trimmed(const char* text) {
  std::string s(text);
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

bool parseDouble(const std::string& s, double* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

// Integers; for bytes also a K/M/G (KiB/MiB/GiB) suffix, with or without "iB"/"B".
bool parseInt(const std::string& s, bool bytes, int64_t* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end == s.c_str()) return false;
  std::string suffix;
  for (const char* p = end; *p; ++p) {
    suffix += static_cast<char>(std::toupper(static_cast<unsigned char>(*p)));
  }
  int shift = 0;
  if (bytes && !suffix.empty()) {
    const char unit = suffix[0];
    shift = unit == 'K' ? 10 : unit == 'M' ? 20 : unit == 'G' ? 30 : -1;
    const std::string rest = suffix.substr(1);
    if (shift < 0 || !(rest.empty() || rest == "B" || rest == "IB")) return false;
  } else if (!suffix.empty()) {
    return false;
  }
  const long long limit = (1ll << 62) >> shift;
  if (v > limit || v < -limit) return false;
  *out = static_cast<int64_t>(v) * (int64_t{1} << shift);
  return true;
}

bool parseBool(const std::string& s, bool* out) {
  std::string v;
  for (char c : s) v += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (v == "1" || v == "true" || v == "yes" || v == "on") {
    *out = true;
  } else if (v == "0" || v == "false" || v == "no" || v == "off") {
    *out = false;
  } else {
    return false;
  }
  return true;
}

const char* expectation(const Knob& knob) {
  switch (knob.kind) {
    case Kind::kFloat:
      if (knob.minimum < 0) return "a number";
      return knob.minimum > 0 ? "a positive number" : "a number >= 0";
    case Kind::kInt: return knob.minimum > 0 ? "an integer >= 1" : "an integer >= 0";
    case Kind::kBytes: return knob.minimum > 0 ? "a byte count >= 4096" : "a byte count >= 0";
    case Kind::kBool: return "one of 1/0/true/false/yes/no/on/off";
    case Kind::kString:
      if (knob.string_field == &Config::ipc_order) return "host or device";
      if (knob.string_field == &Config::cpu_bind) return "none, auto or core";
      if (knob.string_field == &Config::gpu_path) return "auto, nccl, ipc or staged";
      if (knob.string_field == &Config::single_copy) {
        return "auto, or one of 1/0/true/false/yes/no/on/off";
      }
      return "auto, tcp or shm";
    case Kind::kDocOnly: break;
  }
  return "a valid value";
}

// Applies one value to *config; false if it is not valid for the knob.
bool apply(const Knob& knob, const std::string& value, Config* config) {
  switch (knob.kind) {
    case Kind::kFloat: {
      double v = 0;
      if (!parseDouble(value, &v) || v < knob.minimum) return false;
      config->*knob.float_field = v;
      return true;
    }
    case Kind::kInt:
    case Kind::kBytes: {
      int64_t v = 0;
      if (!parseInt(value, knob.kind == Kind::kBytes, &v) || v < knob.minimum) return false;
      config->*knob.int_field = v;
      return true;
    }
    case Kind::kBool: {
      bool v = false;
      if (!parseBool(value, &v)) return false;
      config->*knob.bool_field = v;
      return true;
    }
    case Kind::kString: {
      std::string v;  // the choice knobs are case-insensitive
      for (char c : value) v += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (knob.string_field == &Config::single_copy) {  // stored as auto, on or off
        bool on = false;
        if (v != "auto" && !parseBool(v, &on)) return false;
        config->single_copy = v == "auto" ? v : on ? "on" : "off";
      } else if (knob.string_field == &Config::ipc_order ||
                 knob.string_field == &Config::cpu_bind) {
        const bool ipc = knob.string_field == &Config::ipc_order;
        if (ipc ? v != "host" && v != "device" : v != "none" && v != "core" && v != "auto") {
          return false;
        }
        config->*knob.string_field = v;
      } else if (knob.string_field == &Config::transport ||
                 knob.string_field == &Config::gpu_path) {
        const bool transport = knob.string_field == &Config::transport;
        const bool known = v == "auto" || (transport ? v == "tcp" || v == "shm"
                                                     : v == "nccl" || v == "staged" || v == "ipc");
        if (!known) {
          return false;
        }
        config->*knob.string_field = v;
      } else {
        config->*knob.string_field = value;
      }
      return true;
    }
    case Kind::kDocOnly: break;
  }
  return true;
}

void warnOnce(const std::string& variable, const std::string& value, const Knob& knob) {
  static std::mutex mutex;
  static std::set<std::pair<std::string, std::string>> warned;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!warned.insert({variable, value}).second) return;
  }
  const char* fallback = knob.entry.default_value;
  HVD_LOG(kWarning, "config") << variable << "='" << value << "' is not valid (expected "
                              << expectation(knob) << "); using the default "
                              << (*fallback ? fallback : "(empty)") << " instead";
}

}  // namespace

Config Config::fromEnvironment() {
  Config config;
  for (const Knob& knob : knobs()) {
    if (knob.kind == Kind::kDocOnly) continue;
    const char* variable = knob.entry.name;
    const char* raw = std::getenv(variable);
    if ((raw == nullptr || *raw == '\0') && knob.entry.alias != nullptr) {
      variable = knob.entry.alias;
      raw = std::getenv(variable);
    }
    if (raw == nullptr) continue;
    const std::string value = trimmed(raw);
    if (value.empty()) continue;  // set but empty: the default, as if unset
    if (!apply(knob, value, &config)) {
      warnOnce(variable, raw, knob);
    } else if (knob.set_flag != nullptr) {
      config.*knob.set_flag = true;
    }
  }
  const char* multi_rank = std::getenv("NCCL_MULTI_RANK_GPU_ENABLE");
  config.nccl_multi_rank_gpu =
      multi_rank != nullptr && std::strtol(trimmed(multi_rank).c_str(), nullptr, 10) != 0;
  return config;
}

const std::vector<ConfigEntry>& configTable() {
  static const std::vector<ConfigEntry> kTable = [] {
    std::vector<ConfigEntry> table;
    for (const Knob& knob : knobs()) table.push_back(knob.entry);
    return table;
  }();
  return kTable;
}

}  // namespace hvd::common
