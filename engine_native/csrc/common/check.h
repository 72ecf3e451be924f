// Internal invariant checks. A failed HVD_CHECK is a bug in the core, never a user error:
// it prints file:line and both values, then aborts the process.
#pragma once

#include <cstdio>
#include <cstdlib>

#include "common/text.h"

#define HVD_CHECK(cond)                                                               \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "[hvd] check failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                   \
    }                                                                                 \
  } while (0)

#define HVD_CHECK_EQ(a, b)                                                            \
  do {                                                                                \
    auto hvd_a_ = (a);                                                                \
    auto hvd_b_ = (b);                                                                \
    if (!(hvd_a_ == hvd_b_)) {                                                        \
      ::hvd::common::Text hvd_os_;                                                    \
      hvd_os_ << #a << " == " << #b << " (" << hvd_a_ << " vs " << hvd_b_ << ")";     \
      std::fprintf(stderr, "[hvd] check failed at %s:%d: %s\n", __FILE__, __LINE__,  \
                   hvd_os_.str().c_str());                                            \
      std::abort();                                                                   \
    }                                                                                 \
  } while (0)
