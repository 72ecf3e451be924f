// The _testhooks extension: Python handles on parts of the core that the product only runs
// inside its background loop (a Timeline, a ParameterManager, the GP/EI math), so unit tests
// and benchmarks drive them directly. Compiled with the core's sources they need by
// tests/native/build.py, never by setup.py: nothing here ships. GIL held throughout.
#pragma once

#include <vector>

typedef struct _object PyObject;

namespace hvd::testhooks {

// Sequence of numbers -> doubles; false with a Python exception naming `what` otherwise.
bool toDoubles(PyObject* seq, std::vector<double>* out, const char* what);

// TimelineWriterForTest (timeline_writer.cc). 0, or -1 with an exception set.
int addTimelineWriter(PyObject* module);
// ParameterManagerForTest, autotune_maximize, gp_fit_predict (autotune.cc). Same contract.
int addAutotuneHooks(PyObject* module);
// device_reduce, cpu_reduce, compile_reduce_kernels, ... (device_kernels.cc). Same contract.
int addDeviceKernelHooks(PyObject* module);
// check_peer_block (peer_block.cc): the single-copy reads' bounds check. Same contract.
int addPeerBlockHooks(PyObject* module);
// sha256, hmac_sha256, constant_time_equal (hmac.cc): common/hmac.h. Same contract.
int addHmacHooks(PyObject* module);
// codec_write, codec_read, decode_requests, ... (byte_codec.cc): common/byte_codec.h and the
// negotiation decoders over it. Same contract.
int addByteCodecHooks(PyObject* module);
// running_threads, cpu_share, cpu_ranges, cpus_outnumbered (cpu_share.cc): the /proc/loadavg
// reading of runtime/core_headroom.h, the CPU shares of runtime/cpu_binding.h, and the CPU lists
// and the count of ranks against CPUs of common/cpu_ranges.h. Same contract.
int addCpuShareHooks(PyObject* module);

}  // namespace hvd::testhooks
