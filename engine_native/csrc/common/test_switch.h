// Test-only fault switches (HVD_TEST_<NAME> environment variables): a forced probe failure, a
// delayed read, a cache bound small enough to reach. They exist only in a core built with
// HVD_TEST_SWITCHES=1 (./dev.sh and CI build that one); any other build, and every wheel,
// compiles them out, names and all, so no variable can change a shipped core's behaviour.
#pragma once

#include <cstdlib>

#ifdef HVD_TEST_SWITCHES
// The value of HVD_TEST_<name>, or nullptr when unset. `name` must be a string literal.
#define HVD_TEST_SWITCH(name) (std::getenv("HVD_TEST_" name))
#else
#define HVD_TEST_SWITCH(name) (static_cast<const char*>(nullptr))
#endif

namespace hvd::common {

// Whether this core reads HVD_TEST_* switches (the Python side reports it: core_info).
constexpr bool kTestSwitches =
#ifdef HVD_TEST_SWITCHES
    true;
#else
    false;
#endif

}  // namespace hvd::common
