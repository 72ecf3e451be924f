// common/process_state.h.
#include "common/process_state.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

namespace hvd::common {

bool processStopped(int64_t pid) {
  if (pid <= 0) return false;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%lld/stat", static_cast<long long>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char text[512];  // "pid (comm) S ...": the name is at most 64 bytes, the state follows it
  const ssize_t got = ::read(fd, text, sizeof(text) - 1);
  ::close(fd);
  if (got <= 0) return false;
  text[got] = '\0';
  const char* name_end = std::strrchr(text, ')');  // the name may itself hold ')'
  if (name_end == nullptr || name_end[1] != ' ') return false;
  return name_end[2] == 'T' || name_end[2] == 't';
}

}  // namespace hvd::common
