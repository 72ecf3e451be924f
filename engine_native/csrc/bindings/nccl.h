// NCCL / CUDA-runtime loader bindings for engine_native._core: nccl_load, nccl_version,
// cuda_runtime_load (contract in engine_native/_core.pyi; engine_native/gpu.py is the caller
// that computes the candidate paths). Registered from PyInit__core on the importing thread;
// every function needs the GIL, and releases it while a library is being loaded.
#pragma once

typedef struct _object PyObject;

// Adds the functions to `module`. Returns 0, or -1 with a Python exception set.
int addNcclBindings(PyObject* module);
