// Loader: finds NCCL and the CUDA runtime at run time with dlopen and publishes their function
// tables (api.h), so the core is never compiled or linked against CUDA (DESIGN §3 "Boundary").
// Called at first CUDA use: from the binding (engine_native.gpu passes the candidate list, since
// only Python knows site-packages and torch's lib folder) on a framework thread, and read by the
// background thread through ncclApi()/cudaApi(). Thread-safe; a loaded library is never unloaded.
#pragma once

#include <string>
#include <vector>

#include "transport/dynamic_library.h"
#include "transport/nccl/api.h"

namespace hvd::transport::nccl {

// Tries `candidates` in order and keeps the first usable one (transport/dynamic_library.h):
// it loads, reports a version >= the minimum in api.h, and exports every symbol of the table.
// Once one is loaded, later calls return it unchanged and ignore their candidates; after a
// failure, the next call tries again (the user may have installed the library meanwhile).
LoadResult loadNccl(const std::vector<std::string>& candidates);
LoadResult loadCudaRuntime(const std::vector<std::string>& candidates);

// The last result of each loader, without trying anything.
LoadResult ncclLoadState();
LoadResult cudaRuntimeLoadState();

// The published tables: nullptr until the matching load succeeded, then the same pointer for
// the life of the process. Lock-free.
const NcclApi* ncclApi();
const CudaApi* cudaApi();

// 23203 -> "2.32.3", 2804 -> "2.8.4"; 12090 -> "12.9".
std::string ncclVersionText(int code);
std::string cudaVersionText(int code);

}  // namespace hvd::transport::nccl
