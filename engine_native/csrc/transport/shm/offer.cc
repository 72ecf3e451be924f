// The shared-memory offer (transport/shm/offer.h).
#include "transport/shm/offer.h"

#include "common/byte_codec.h"
#include "common/check.h"
#include "common/hmac.h"

namespace hvd::transport::shm {

using common::Status;

namespace {

constexpr size_t kFixedBytes = 32;
constexpr size_t kMaxNameBytes = 255;  // the u8 length

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
  std::string msg;
  msg.reserve(kFixedBytes + offer.name.size());
  common::ByteWriter w(&msg);
  w.u32(magic);
  w.u8(offer.ok ? 1 : 0);
  w.u8(static_cast<uint8_t>(offer.name.size()));
  w.u16(0);
  w.u32(offer.index);
  w.u32(offer.count);
  w.u32(offer.depth);
  w.u32(0);
  w.u64(offer.bytes);
  HVD_CHECK_EQ(msg.size(), kFixedBytes);
  w.bytes(offer.name.data(), offer.name.size());
  return tcp::writeFull(fd, msg.data(), msg.size(), deadline);
}

Status readOffer(int fd, uint32_t magic, tcp::Deadline deadline, Offer* offer) {
  uint8_t fixed[kFixedBytes];
  HVD_RETURN_IF_ERROR(tcp::readFull(fd, fixed, sizeof(fixed), deadline));
  common::ByteReader in(fixed, sizeof(fixed));
  uint32_t sent_magic = 0;
  uint8_t ok = 0, name_bytes = 0;
  const bool parsed = in.u32(&sent_magic) && in.u8(&ok) && in.u8(&name_bytes) && in.skip(2) &&
                      in.u32(&offer->index) && in.u32(&offer->count) &&
                      in.u32(&offer->depth) && in.skip(4) && in.u64(&offer->bytes);
  if (!parsed || sent_magic != magic) return common::internalError("bad shared-memory offer");
  offer->ok = ok == 1;
  offer->name.resize(name_bytes);
  if (!offer->name.empty()) {
    HVD_RETURN_IF_ERROR(tcp::readFull(fd, &offer->name[0], offer->name.size(), deadline));
  }
  const bool ours = offer->name.rfind("/hvd-", 0) == 0 &&
                    offer->name.find('/', 1) == std::string::npos;
  if (offer->ok && !ours) return common::internalError("malformed shared-memory offer");
  return Status::ok();
}

}  // namespace hvd::transport::shm
