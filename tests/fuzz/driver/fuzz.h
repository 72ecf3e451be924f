// The decoder fuzz driver's vocabulary (tests/fuzz): a Target is one decoder of bytes that come
// from another process, with its encoder's valid messages as seeds. main.cc mutates the seeds,
// feeds every input to run() and counts outcomes; the whole program is built under
// AddressSanitizer + UndefinedBehaviorSanitizer (tests/fuzz/build_fuzzer.py), so an
// out-of-bounds access or undefined behaviour aborts with a report. Single-threaded except
// for the watchdog in main.cc.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace hvd::fuzz {

// splitmix64: small, seedable, the same sequence on every machine.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t n) { return n == 0 ? 0 : next() % n; }  // [0, n)
  bool chance(uint32_t one_in) { return below(one_in) == 0; }
  std::string bytes(size_t n) {
    std::string out(n, '\0');
    for (char& c : out) c = static_cast<char>(next());
    return out;
  }

 private:
  uint64_t state_;
};

// What one input did. kFailed is a decoder that broke its contract without crashing: an
// unexpected status code, or an accepted message that does not survive re-encoding.
enum class Verdict { kAccepted, kRejected, kFailed };

struct Outcome {
  Verdict verdict;
  std::string why;  // kFailed: what was wrong
};

inline Outcome accepted() { return {Verdict::kAccepted, ""}; }
inline Outcome rejected() { return {Verdict::kRejected, ""}; }
inline Outcome failed(std::string why) { return {Verdict::kFailed, std::move(why)}; }

struct Target {
  std::string name;
  std::string decodes;  // the function(s) under test, for --list
  // Valid encodings made by the matching encoder from `rng` (at least one).
  std::function<std::vector<std::string>(Rng& rng)> seeds;
  std::function<Outcome(const std::string& input)> run;
  bool listed = true;  // false: only by name (the sanitizer canary)
};

// Each targets_*.cc appends its targets.
void addCommonTargets(std::vector<Target>* out);
void addCoordTargets(std::vector<Target>* out);
void addTransportTargets(std::vector<Target>* out);
void addShmSetupTargets(std::vector<Target>* out);
void addRuntimeTargets(std::vector<Target>* out);

// For socket-fed decoders (targets_transport.cc): a connected AF_UNIX stream pair. The
// decoder reads fd(); the fuzzer feeds the other end and hangs it up, so the decoder reads
// exactly the bytes fed and then EOF, never waiting. written() drains what the decoder sent.
class FedSocket {
 public:
  FedSocket();
  explicit FedSocket(const std::string& input) : FedSocket() { feed(input); hangUp(); }
  ~FedSocket();
  FedSocket(const FedSocket&) = delete;
  FedSocket& operator=(const FedSocket&) = delete;
  int fd() const { return fd_; }
  void feed(const std::string& bytes);
  void hangUp();
  std::string written();

 private:
  int fd_ = -1;
  int peer_ = -1;
};

}  // namespace hvd::fuzz
