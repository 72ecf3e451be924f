// Status: the result of every fallible operation in the core. Errors never cross threads as
// exceptions: the background loop stores a Status on the handle and wait() raises it in the
// caller's thread (bindings map Code -> Python exception type).
#pragma once

#include <string>
#include <utility>

namespace hvd::common {

enum class Code {
  kOk = 0,
  kInvalidArgument,   // caller's mistake, local to one rank -> ValueError
  kTypeError,         // unsupported dtype etc. -> TypeError
  kMismatch,          // ranks disagree (dtype/shape/op/root...) -> HorovodInternalError on all ranks
  kPeerLost,          // a peer died or disconnected -> HorovodInternalError
  kTimeout,           // no progress within HVD_TIMEOUT -> HorovodInternalError
  kAborted,           // abort() on this or another rank -> HorovodInternalError
  kShutDown,          // the core was shut down -> HorovodInternalError
  kInternal,          // a broken invariant or system call failure -> HorovodInternalError
};

class Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }
  bool isOk() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

inline Status invalidArgument(std::string m) { return Status(Code::kInvalidArgument, std::move(m)); }
inline Status typeError(std::string m) { return Status(Code::kTypeError, std::move(m)); }
inline Status mismatch(std::string m) { return Status(Code::kMismatch, std::move(m)); }
inline Status peerLost(std::string m) { return Status(Code::kPeerLost, std::move(m)); }
inline Status timedOut(std::string m) { return Status(Code::kTimeout, std::move(m)); }
inline Status aborted(std::string m) { return Status(Code::kAborted, std::move(m)); }
inline Status internalError(std::string m) { return Status(Code::kInternal, std::move(m)); }

}  // namespace hvd::common

// Propagate a non-ok Status to the caller.
#define HVD_RETURN_IF_ERROR(expr)                 \
  do {                                            \
    ::hvd::common::Status hvd_status_ = (expr);   \
    if (!hvd_status_.isOk()) return hvd_status_;  \
  } while (0)
