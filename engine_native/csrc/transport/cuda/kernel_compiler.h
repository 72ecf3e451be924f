// One NVRTC compilation: source + options -> PTX or cubin, with NVRTC's log in the error.
// Used by device_kernels.cc (the reduction kernels) on whatever thread first needs them.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "transport/cuda/api.h"

namespace hvd::transport::cuda {

// Compiles `source` (named `name` in messages) with `options`; on success *image holds the PTX
// text (ptx = true, NUL-terminated) or the cubin. A compile error's Status carries the log.
common::Status compileWithNvrtc(const NvrtcApi& nvrtc, const std::string& source,
                                const std::string& name, const std::vector<std::string>& options,
                                bool ptx, std::string* image);

}  // namespace hvd::transport::cuda
