// The shared-memory offer (transport/shm/offer.h).
#include "transport/shm/offer.h"

#include <cstring>

#include "common/check.h"
#include "common/hmac.h"

namespace hvd::transport::shm {

using common::Status;

namespace {

constexpr size_t kFixedBytes = 32;
constexpr size_t kMaxNameBytes = 255;  // the u8 length

void putLe(uint8_t* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

uint64_t getLe(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

}  // namespace

std::string segmentName(const std::string& job_id, char tag, int rank) {
  std::string name = "/hvd-";
  for (char c : job_id.substr(0, 24)) {
    const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                      (c >= '0' && c <= '9') || c == '-' || c == '_';
    name += keep ? c : '_';
  }
  uint8_t nonce[8];
  common::randomBytes(nonce, sizeof(nonce));
  return name + "-" + tag + std::to_string(rank) + "-" + common::toHex(nonce, sizeof(nonce));
}

Status writeOffer(int fd, uint32_t magic, const Offer& offer, tcp::Deadline deadline) {
  HVD_CHECK(offer.name.size() <= kMaxNameBytes);
  uint8_t msg[kFixedBytes + kMaxNameBytes] = {};
  putLe(msg, magic, 4);
  msg[4] = offer.ok ? 1 : 0;
  msg[5] = static_cast<uint8_t>(offer.name.size());
  putLe(msg + 8, offer.index, 4);
  putLe(msg + 12, offer.count, 4);
  putLe(msg + 16, offer.depth, 4);
  putLe(msg + 24, offer.bytes, 8);
  std::memcpy(msg + kFixedBytes, offer.name.data(), offer.name.size());
  return tcp::writeFull(fd, msg, kFixedBytes + offer.name.size(), deadline);
}

Status readOffer(int fd, uint32_t magic, tcp::Deadline deadline, Offer* offer) {
  uint8_t fixed[kFixedBytes];
  HVD_RETURN_IF_ERROR(tcp::readFull(fd, fixed, sizeof(fixed), deadline));
  if (getLe(fixed, 4) != magic) return common::internalError("bad shared-memory offer");
  offer->ok = fixed[4] == 1;
  offer->index = static_cast<uint32_t>(getLe(fixed + 8, 4));
  offer->count = static_cast<uint32_t>(getLe(fixed + 12, 4));
  offer->depth = static_cast<uint32_t>(getLe(fixed + 16, 4));
  offer->bytes = getLe(fixed + 24, 8);
  offer->name.resize(fixed[5]);
  if (!offer->name.empty()) {
    HVD_RETURN_IF_ERROR(tcp::readFull(fd, &offer->name[0], offer->name.size(), deadline));
  }
  const bool ours = offer->name.rfind("/hvd-", 0) == 0 &&
                    offer->name.find('/', 1) == std::string::npos;
  if (offer->ok && !ours) return common::internalError("malformed shared-memory offer");
  return Status::ok();
}

}  // namespace hvd::transport::shm
