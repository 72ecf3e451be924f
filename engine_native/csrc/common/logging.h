// One logger for the core: levels plus subsystems, every line prefixed with the rank.
// HVD_LOG=trace|debug|info|warning|error (alias HOROVOD_LOG_LEVEL), HVD_LOG_SUBSYS=transport,coord
// Thread-safe; writes whole lines to stderr.
#pragma once

#include <string>

#include "common/text.h"  // Note [No iostreams in the core]

namespace hvd::common {

enum class LogLevel { kTrace = 0, kDebug, kInfo, kWarning, kError };

void setLogRank(int rank);
bool logEnabled(LogLevel level, const char* subsystem);
void logLine(LogLevel level, const char* subsystem, const std::string& text);

}  // namespace hvd::common

// Usage: HVD_LOG(kInfo, "transport") << "rank 0 -> 1 via shm";
#define HVD_LOG(level, subsys)                                                          \
  for (bool hvd_on_ = ::hvd::common::logEnabled(::hvd::common::LogLevel::level, subsys); \
       hvd_on_; hvd_on_ = false)                                                        \
  ::hvd::common::LogStream(::hvd::common::LogLevel::level, subsys).stream()

namespace hvd::common {
class LogStream {
 public:
  LogStream(LogLevel level, const char* subsys) : level_(level), subsys_(subsys) {}
  ~LogStream() { logLine(level_, subsys_, os_.str()); }
  Text& stream() { return os_; }

 private:
  LogLevel level_;
  const char* subsys_;
  Text os_;
};
}  // namespace hvd::common
