// The logger behind HVD_LOG (common/logging.h). Settings are read from the environment once,
// on first use; every line is formatted in full and written with one write(2) under a mutex,
// so lines from different threads never interleave.
#include "common/logging.h"

#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace hvd::common {
namespace {

const char* const kLevelNames[] = {"trace", "debug", "info", "warning", "error"};

struct LogSettings {
  LogLevel level = LogLevel::kWarning;
  std::vector<std::string> subsystems;  // empty = all
  std::string bad_level;                // a value of HVD_LOG we could not parse
};

std::string lowered(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (!std::isspace(static_cast<unsigned char>(c))) {
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
  }
  return out;
}

bool parseLevel(const std::string& text, LogLevel* level) {
  const std::string value = lowered(text);
  for (int i = 0; i <= static_cast<int>(LogLevel::kError); ++i) {
    if (value == kLevelNames[i]) {
      *level = static_cast<LogLevel>(i);
      return true;
    }
  }
  if (value == "warn") {
    *level = LogLevel::kWarning;
    return true;
  }
  return false;
}

LogSettings readSettings() {
  LogSettings settings;
  const char* level = std::getenv("HVD_LOG");
  if (level == nullptr || *level == '\0') level = std::getenv("HOROVOD_LOG_LEVEL");
  if (level != nullptr && *level != '\0' && !parseLevel(level, &settings.level)) {
    settings.bad_level = level;
  }
  const char* subsys = std::getenv("HVD_LOG_SUBSYS");
  std::string item;
  for (const char* p = subsys ? subsys : ""; ; ++p) {
    if (*p == ',' || *p == '\0') {
      if (!item.empty()) settings.subsystems.push_back(item);
      item.clear();
      if (*p == '\0') break;
    } else if (!std::isspace(static_cast<unsigned char>(*p))) {
      item += static_cast<char>(std::tolower(static_cast<unsigned char>(*p)));
    }
  }
  return settings;
}

const LogSettings& settings() {
  static const LogSettings kSettings = [] {
    LogSettings s = readSettings();
    if (!s.bad_level.empty()) {
      logLine(LogLevel::kWarning, "common",
              "HVD_LOG='" + s.bad_level +
                  "' is not a level (trace|debug|info|warning|error); using warning");
    }
    return s;
  }();
  return kSettings;
}

std::atomic<int> g_rank{-1};
std::mutex g_write_mutex;

void writeWhole(const std::string& line) {
  std::lock_guard<std::mutex> lock(g_write_mutex);
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    ssize_t n = ::write(STDERR_FILENO, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace

void setLogRank(int rank) { g_rank.store(rank, std::memory_order_relaxed); }

// The subsystem filter only narrows chatter: warnings and errors always pass, so a narrowed
// HVD_LOG_SUBSYS never hides a failure.
bool logEnabled(LogLevel level, const char* subsystem) {
  const LogSettings& s = settings();
  if (level < s.level) return false;
  if (s.subsystems.empty() || level >= LogLevel::kWarning) return true;
  const std::string name = lowered(subsystem ? subsystem : "");
  for (const std::string& wanted : s.subsystems) {
    if (wanted == name) return true;
  }
  return false;
}

void logLine(LogLevel level, const char* subsystem, const std::string& text) {
  const int rank = g_rank.load(std::memory_order_relaxed);
  std::string line = "[hvd rank ";
  line += rank >= 0 ? std::to_string(rank) : std::string("?");
  line += "] ";
  line += kLevelNames[static_cast<int>(level)];
  line += ' ';
  line += subsystem ? subsystem : "core";
  line += ": ";
  line += text;
  if (line.empty() || line.back() != '\n') line += '\n';
  writeWhole(line);
}

}  // namespace hvd::common
