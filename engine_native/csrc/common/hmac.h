// SHA-256 (FIPS 180-4), HMAC-SHA256 (RFC 2104) and the helpers the handshake needs: a
// constant-time compare and random bytes from the kernel. Used by transport/tcp/handshake.cc
// (and the rendezvous store) to prove the per-job secret. Pure functions; any thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace hvd::common {

constexpr size_t kSha256Bytes = 32;
using Digest = std::array<uint8_t, kSha256Bytes>;

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  Digest finish();  // the object must not be updated afterwards

 private:
  void compress(const uint8_t* block);

  uint32_t state_[8];
  uint8_t block_[64];
  size_t block_used_ = 0;
  uint64_t total_bytes_ = 0;
};

Digest sha256(const void* data, size_t n);
Digest hmacSha256(const std::string& key, const void* data, size_t n);

// Compares without an early exit, so the time taken does not reveal where a MAC differs.
bool constantTimeEqual(const uint8_t* a, const uint8_t* b, size_t n);

// Fills `out` from getrandom(2) (falls back to /dev/urandom). False if neither works.
bool randomBytes(uint8_t* out, size_t n);

std::string toHex(const uint8_t* data, size_t n);

}  // namespace hvd::common
