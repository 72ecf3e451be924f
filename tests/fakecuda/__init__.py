"""A fake CUDA runtime and a fake NCCL, built from C at test time, for machines without a GPU.

``build.build_fake_cuda(dest)`` compiles ``libcudart.so.12`` and ``libnccl.so.2`` (one folder;
the NCCL links the cudart with RUNPATH ``$ORIGIN``, so a process gets one cudart whichever it
opens first); ``fixtures`` has the session fixture ``fake_cuda``; ``clib`` drives both through
ctypes. "Device memory" is host memory, each stream is a worker thread, and collectives really
cross processes (files in a per-communicator folder, futex waits). The C files' header comments
and Notes are the specification.

Using them in a spawned rank: put ``fake_cuda.env()`` (``HVD_CUDA_RUNTIME_LIBRARY``,
``HVD_NCCL_LIBRARY``) in its environment, and give ranks that share a communicator distinct
``FAKE_CUDA_BUS_IDS`` (the fake NCCL refuses two ranks on one (host, bus id), as NCCL does).
Spawn, don't fork, once a stream exists (streams are threads).

Environment (read once per process unless noted):

- ``FAKE_CUDA_DEVICE_COUNT`` (default 1), ``FAKE_CUDA_BUS_IDS`` (comma-separated, entry d for
  device d; default ``0000:0<d+1>:00.0``).
- ``FAKE_CUDA_NO_MEMPOOL=1``: ``cudaMallocAsync`` answers cudaErrorNotSupported, as on a
  device without memory pools; ``FAKE_CUDA_DEVICE_BYTES=N``: device memory runs out past N
  live bytes (both read per call).
- ``FAKE_NCCL_VERSION`` (default 22809, read per call), ``FAKE_NCCL_DIR`` (where communicator
  folders go; default /dev/shm, else $TMPDIR or /tmp; read per init).
- ``FAKE_NCCL_INIT_TIMEOUT_S`` (default 60) and ``FAKE_NCCL_TIMEOUT_S`` (default 300): seconds,
  fractions allowed, read per init.
- ``FAKE_NCCL_FAIL_INIT=1``: this rank's init fails (ncclSystemError; its peers get
  ncclRemoteError). ``FAKE_NCCL_INIT_STALL=hang|fail`` (read per init): this rank never joins
  its communicators; ``hang`` leaves every member's set-up in progress (a blocking init
  sleeps until ``FAKE_NCCL_INIT_TIMEOUT_S``), ``fail`` reports ncclSystemError on this rank
  while the others stay in progress (Note [Init states]). ``FAKE_NCCL_FAIL_COLLECTIVE=k``: this process's k-th NCCL call (every
  collective, send and receive counted, 1-based) records async error ncclSystemError and hangs
  on its stream until ncclCommAbort.
"""
