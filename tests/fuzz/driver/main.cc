// fuzz_decoders: feeds every decoder of peer bytes (fuzz.h) random and mutated inputs.
//
//   fuzz_decoders [--inputs N] [--seed S] [--seeds DIR] [--hang-seconds T] [TARGET ...]
//   fuzz_decoders --replay TARGET HEX     one input, as a reproducer prints it
//   fuzz_decoders --list
//
// Per target: seeds = valid encodings from its encoder (seeded RNG) plus DIR/TARGET.hex
// (regression inputs, one hex string a line, run first); then N inputs: a tenth the seeds
// themselves, a tenth random bytes, the rest seeds mutated 1-4 times (mutate()). Prints
// `decoder | inputs | accepted | rejected | crashes | seconds`. Exit 0 only when nothing failed.
// A sanitizer report, a signal or a hang (no input finished for T seconds; the watchdog
// thread) prints the reproducer first: target, seed, input number and the input in hex.
#include <sanitizer/common_interface_defs.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include "fuzz.h"

namespace hvd::fuzz {
namespace {

constexpr size_t kMaxInputBytes = 64 << 10;  // FedSocket writes an input at once

// --- the input being run, for the reproducer (read by a signal handler or the watchdog) ---
struct Current {
  std::atomic<const char*> target{nullptr};
  std::atomic<const std::string*> input{nullptr};
  std::atomic<uint64_t> index{0};
  std::atomic<uint64_t> finished{0};  // inputs completed so far, all targets
  uint64_t seed = 0;
};
Current g_current;

// Async-signal-safe: write(2) only, the hex formatted by hand.
void writeText(const char* s) { (void)!::write(2, s, std::strlen(s)); }

void writeNumber(uint64_t v) {
  char buf[24];
  int i = sizeof(buf);
  buf[--i] = '\0';
  do { buf[--i] = static_cast<char>('0' + v % 10); v /= 10; } while (v != 0);
  writeText(buf + i);
}

void printReproducer(const char* cause) {
  const char* target = g_current.target.load();
  const std::string* input = g_current.input.load();
  writeText("\n=== fuzz_decoders: ");
  writeText(cause);
  writeText(" ===\nreproducer: target=");
  writeText(target != nullptr ? target : "?");
  writeText(" seed=");
  writeNumber(g_current.seed);
  writeText(" input#=");
  writeNumber(g_current.index.load());
  writeText("\nreplay: fuzz_decoders --replay ");
  writeText(target != nullptr ? target : "?");
  writeText(" ");
  if (input != nullptr) {
    static const char kHex[] = "0123456789abcdef";
    char pair[2];
    for (unsigned char c : *input) {
      pair[0] = kHex[c >> 4];
      pair[1] = kHex[c & 15];
      (void)!::write(2, pair, 2);
    }
    if (input->empty()) writeText("''");
  }
  writeText("\n");
}

void onSanitizerDeath() { printReproducer("sanitizer report above"); }

void onSignal(int sig) {
  printReproducer(sig == SIGABRT ? "abort" : "fatal signal");
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

// Reports and ends the process when no input finished for `seconds`.
void watchdog(double seconds) {
  uint64_t seen = g_current.finished.load();
  auto since = std::chrono::steady_clock::now();
  while (true) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const uint64_t now_done = g_current.finished.load();
    const auto now = std::chrono::steady_clock::now();
    if (now_done != seen) {
      seen = now_done;
      since = now;
    } else if (g_current.target.load() != nullptr &&
               std::chrono::duration<double>(now - since).count() > seconds) {
      printReproducer("hang: the input ran past the hang limit");
      ::_exit(3);
    }
  }
}

// --- inputs ---
void putLe(std::string* s, size_t at, uint64_t v, int width) {
  for (int i = 0; i < width && at + i < s->size(); ++i) (*s)[at + i] = static_cast<char>(v >> (8 * i));
}

// One mutation of `s`: the classic byte-level ones plus length fields set to the values
// that break careless size arithmetic (the offsets are not known, so any position may be one).
void mutateOnce(std::string* s, const std::vector<std::string>& seeds, Rng& rng) {
  static const uint8_t kBytes[] = {0x00, 0xff, 0x7f, 0x80, 0x01, 0xfe};
  static const uint64_t kLengths[] = {0, 1, 0x7f, 0x80, 0xff, 0xffff, 0x7fffffff, 0x80000000,
                                      0xffffffff, 0xfffffffe, 0x100000000ull,
                                      0x7fffffffffffffffull, 0x8000000000000000ull,
                                      0xffffffffffffffffull, 64ull << 20, (64ull << 20) + 1};
  const size_t at = rng.below(s->size() + 1);
  switch (rng.below(10)) {
    case 0:  // bit flip
      if (!s->empty()) (*s)[at % s->size()] ^= static_cast<char>(1u << rng.below(8));
      break;
    case 1:  // an interesting byte
      if (!s->empty()) (*s)[at % s->size()] = static_cast<char>(kBytes[rng.below(6)]);
      break;
    case 2:  // truncation
      s->resize(at);
      break;
    case 3:  // extension
      *s += rng.bytes(1 + rng.below(32));
      break;
    case 4: {  // a length field: 4 or 8 bytes, little-endian, at any offset
      const uint64_t v = rng.chance(4) ? s->size() + rng.below(3) - 1 : kLengths[rng.below(16)];
      putLe(s, at, v, rng.chance(2) ? 4 : 8);
      break;
    }
    case 5: {  // splice: this one's head, another seed's tail
      const std::string& other = seeds[rng.below(seeds.size())];
      s->resize(at);
      *s += other.substr(rng.below(other.size() + 1));
      break;
    }
    case 6:  // insert random bytes
      s->insert(at, rng.bytes(1 + rng.below(8)));
      break;
    case 7:  // delete a range
      s->erase(at, 1 + rng.below(8));
      break;
    case 8: {  // duplicate a chunk (a repeated entry or field)
      const size_t n = 1 + rng.below(16);
      s->insert(at, s->substr(rng.below(s->size() + 1), n));
      break;
    }
    default: {  // a long run of one short chunk: many entries, long names
      const std::string chunk = s->substr(rng.below(s->size() + 1), 1 + rng.below(4));
      std::string run;
      for (uint64_t k = 100 + rng.below(2000); k > 0; --k) run += chunk;
      s->insert(at, run);
    }
  }
}

std::string makeInput(const std::vector<std::string>& seeds, Rng& rng) {
  const uint64_t kind = rng.below(10);
  if (kind == 0) return seeds[rng.below(seeds.size())];
  if (kind == 1) return rng.bytes(rng.below(256));
  std::string s = seeds[rng.below(seeds.size())];
  for (uint64_t k = 1 + rng.below(4); k > 0; --k) mutateOnce(&s, seeds, rng);
  if (s.size() > kMaxInputBytes) s.resize(kMaxInputBytes);
  return s;
}

std::string fromHex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

std::vector<std::string> regressionInputs(const std::string& dir, const std::string& target) {
  std::vector<std::string> out;
  if (dir.empty()) return out;
  std::ifstream in(dir + "/" + target + ".hex");
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] != '#') out.push_back(line == "''" ? "" : fromHex(line));
  }
  return out;
}

struct Counts {
  uint64_t inputs = 0, accepted = 0, rejected = 0, failed = 0;
  double seconds = 0;
};

// Runs one input with the reproducer state published; a kFailed prints its reproducer.
void runOne(const Target& t, const std::string& input, uint64_t index, Counts* c) {
  g_current.input.store(&input);
  g_current.index.store(index);
  const Outcome o = t.run(input);
  g_current.finished.fetch_add(1);
  ++c->inputs;
  if (o.verdict == Verdict::kAccepted) ++c->accepted;
  if (o.verdict == Verdict::kRejected) ++c->rejected;
  if (o.verdict == Verdict::kFailed) {
    if (++c->failed <= 3) printReproducer(("contract broken: " + o.why).c_str());
  }
}

Counts fuzzTarget(const Target& t, uint64_t inputs, uint64_t seed, const std::string& seed_dir) {
  Counts c;
  const auto start = std::chrono::steady_clock::now();
  g_current.target.store(t.name.c_str());
  Rng rng(seed ^ std::hash<std::string>()(t.name));
  std::vector<std::string> seeds = t.seeds(rng);
  uint64_t index = 0;
  for (const std::string& kept : regressionInputs(seed_dir, t.name)) {
    runOne(t, kept, index++, &c);
    seeds.push_back(kept);
  }
  while (index < inputs) runOne(t, makeInput(seeds, rng), index++, &c);
  g_current.target.store(nullptr);
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return c;
}

// Not decoders: planted bugs that prove the build and the watchdog report them (tests/fuzz's
// canary tests). A '!' input reads one byte past its heap copy, a '+' input overflows an
// int32, and either one never returns from canary_hang.
void addCanaries(std::vector<Target>* out) {
  auto seeds = [](Rng&) { return std::vector<std::string>{"!", "+", "a"}; };
  out->push_back({"canary_asan", "reads past the end of a heap buffer", seeds,
                  [](const std::string& in) {
                    std::vector<char> copy(in.begin(), in.end());
                    const size_t at = !copy.empty() && copy[0] == '!' ? copy.size() : 0;
                    volatile char c = at < copy.size() || at > 0 ? copy.data()[at] : 0;
                    (void)c;
                    return rejected();
                  }, false});
  out->push_back({"canary_ubsan", "overflows a signed integer", seeds,
                  [](const std::string& in) {
                    volatile int32_t big = 0x7fffffff;
                    const int32_t step = !in.empty() && in[0] == '+' ? 1 : 0;
                    volatile int32_t sum = big + step;
                    (void)sum;
                    return rejected();
                  }, false});
  out->push_back({"canary_hang", "never returns", seeds, [](const std::string& in) {
                    while (!in.empty() && in[0] != 'a') std::this_thread::sleep_for(std::chrono::hours(1));
                    return rejected();
                  }, false});
}

int usage() {
  std::fprintf(stderr, "usage: fuzz_decoders [--inputs N] [--seed S] [--seeds DIR] "
                       "[--hang-seconds T] [TARGET ...] | --replay TARGET HEX | --list\n");
  return 2;
}

}  // namespace
}  // namespace hvd::fuzz

// UBSan's runtime does not call the death callback: it aborts instead, and onSignal reports.
extern "C" const char* __ubsan_default_options() {
  return "print_stacktrace=1:halt_on_error=1:abort_on_error=1";
}

int main(int argc, char** argv) {
  using namespace hvd::fuzz;
  std::vector<Target> all;
  addCommonTargets(&all);
  addCoordTargets(&all);
  addTransportTargets(&all);
  addShmSetupTargets(&all);
  addRuntimeTargets(&all);
  addCanaries(&all);
  uint64_t inputs = 10000, seed = 1;
  double hang_seconds = 10;
  std::string seed_dir, replay_hex;
  std::vector<std::string> names;
  bool replay = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--inputs" && has_value) inputs = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--seed" && has_value) seed = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--seeds" && has_value) seed_dir = argv[++i];
    else if (a == "--hang-seconds" && has_value) hang_seconds = std::atof(argv[++i]);
    else if (a == "--replay" && i + 2 < argc) { replay = true; names = {argv[i + 1]}; replay_hex = argv[i + 2]; i += 2; }
    else if (a == "--list") {
      for (const Target& t : all) if (t.listed) std::printf("%-22s %s\n", t.name.c_str(), t.decodes.c_str());
      return 0;
    } else if (!a.empty() && a[0] != '-') names.push_back(a);
    else return usage();
  }
  std::vector<const Target*> chosen;
  for (const Target& t : all) {
    bool wanted = names.empty() ? t.listed : false;
    for (const std::string& n : names) wanted = wanted || n == t.name;
    if (wanted) chosen.push_back(&t);
  }
  if (chosen.size() != (names.empty() ? chosen.size() : names.size())) {
    std::fprintf(stderr, "unknown target among the names given (see --list)\n");
    return 2;
  }
  g_current.seed = seed;
  __sanitizer_set_death_callback(onSanitizerDeath);
  ::signal(SIGSEGV, onSignal);
  ::signal(SIGABRT, onSignal);
  ::signal(SIGPIPE, SIG_IGN);
  std::thread(watchdog, hang_seconds).detach();
  if (replay) {
    Counts c;
    g_current.target.store(chosen[0]->name.c_str());
    runOne(*chosen[0], replay_hex == "''" ? "" : fromHex(replay_hex), 0, &c);
    std::printf("%s: %s\n", chosen[0]->name.c_str(),
                c.accepted ? "accepted" : c.rejected ? "rejected" : "FAILED");
    return c.failed == 0 ? 0 : 1;
  }
  std::printf("%-22s | %9s | %9s | %9s | %7s | %7s\n", "decoder", "inputs", "accepted",
              "rejected", "crashes", "seconds");
  std::fflush(stdout);  // a crash or hang ends the process without flushing
  uint64_t failures = 0;
  for (const Target* t : chosen) {
    const Counts c = fuzzTarget(*t, inputs, seed, seed_dir);
    failures += c.failed;
    std::printf("%-22s | %9llu | %9llu | %9llu | %7llu | %7.1f\n", t->name.c_str(),
                static_cast<unsigned long long>(c.inputs),
                static_cast<unsigned long long>(c.accepted),
                static_cast<unsigned long long>(c.rejected),
                static_cast<unsigned long long>(c.failed), c.seconds);
    std::fflush(stdout);
  }
  return failures == 0 ? 0 : 1;
}
