// The standard headers most of the core's sources include, precompiled once per build by
// setup.py (GCC only) and force-included ahead of each source: parsing them was about half of
// every source's compile time. Sources still include what they use; no code includes this.
#pragma once

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>
