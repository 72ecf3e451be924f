// common/process_state.h.
#include "common/process_state.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

namespace hvd::common {

char processState(int64_t pid) {
  if (pid <= 0) return '\0';
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%lld/stat", static_cast<long long>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return '\0';
  char text[512];  // "pid (comm) S ...": comm is at most 15 bytes, the state follows it
  const ssize_t got = ::read(fd, text, sizeof(text) - 1);
  ::close(fd);
  if (got <= 0) return '\0';
  text[got] = '\0';
  const char* name_end = std::strrchr(text, ')');  // comm may itself hold ')' or spaces
  if (name_end == nullptr || name_end[1] != ' ') return '\0';
  return name_end[2];
}

}  // namespace hvd::common
