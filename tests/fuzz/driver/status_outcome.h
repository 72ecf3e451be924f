// What a transport entry point's Status means for a fuzz input (tests/fuzz/driver), shared by
// the transport targets: inputs end in EOF, so kPeerLost is the hang-up, kInternal a refusal
// of bad bytes, anything else a failure.
#pragma once

#include <string>

#include "common/status.h"
#include "fuzz.h"
#include "transport/tcp/socket.h"

namespace hvd::fuzz {

inline transport::tcp::Deadline soon() { return transport::tcp::deadlineAfter(5.0); }

inline Outcome unexpected(const common::Status& s) {
  return failed("unexpected status " + std::to_string(static_cast<int>(s.code())) + ": " +
                s.message());
}

// A refusal of bad bytes (or of a hung-up peer); any other error is unexpected.
inline Outcome refused(const common::Status& s) {
  using common::Code;
  return s.code() == Code::kInternal || s.code() == Code::kPeerLost ? rejected() : unexpected(s);
}

}  // namespace hvd::fuzz
