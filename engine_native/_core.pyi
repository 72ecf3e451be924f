"""Type stub and contract of the native extension ``engine_native._core``.

The extension is framework-neutral: tensors cross as raw pointers plus metadata (dtype code,
shape); the Python caller keeps the memory alive until the handle completes. Nothing here
imports numpy or torch. Codes mirror ``engine_native/csrc/common/dtype.h`` and
``coord/message.h``.
"""
from typing import Any, Optional, Sequence

# Op kinds (coord::OpType)
ALLREDUCE: int  # 0
ALLGATHER: int  # 1
BROADCAST: int  # 2
ALLTOALL: int  # 3
REDUCESCATTER: int  # 4
BARRIER: int  # 5
JOIN: int  # 6

# 1 where the tests' HVD_TEST_* fault switches are compiled in (HVD_TEST_SWITCHES=1, ./dev.sh)
TEST_SWITCHES: int

class HorovodInternalError(RuntimeError):
    """A collective failed: mismatch across ranks, lost peer, timeout, abort or shutdown."""

class Buffer:
    """Core-owned output memory (allgather/alltoall/reducescatter); supports the buffer protocol
    (format 'B', writable), so ``numpy.frombuffer`` / ``torch.frombuffer`` wrap it without a copy."""

def listen(bind_address: str) -> int:
    """Bind the data/control listener; returns the port. Step A of bootstrap."""

def process_cpus() -> str:
    """The CPUs this process could run on when the core first asked, before any binding of its
    own (Note [CPU binding] E), as the kernel writes a CPU list: ``"0-3,8"``."""

def init(rank: int, peers: Sequence[tuple[str, str, int, int, str, str]],
         secret: bytes, job_id: str) -> None:
    """Connect to every peer ``(host_id, address, port, pid, machine_id, cpus)`` (index = global
    rank; machine_id: ``bootstrap.machine_id``, cpus: its ``process_cpus()``), authenticate
    with ``secret``, start the background thread. Reads the env table (HVD_*). Raises
    HorovodInternalError on failure (e.g. a peer never connects within HVD_TIMEOUT)."""

def shutdown() -> None:
    """Agree shutdown with the other ranks (bounded wait), fail pending handles with a shut-down
    error, join the background thread. Idempotent; init() may be called again afterwards."""

def abort(reason: str) -> None:
    """Cancel everything in flight on this and (best effort, via rank 0) every rank; pending and
    later ops fail with an 'aborted' HorovodInternalError until shutdown() + init()."""

def is_initialized() -> bool: ...
def rank() -> int: ...
def size() -> int: ...

def enqueue(kind: int, name: str, dtype: int, shape: Sequence[int], input_ptr: Any,
            output_ptr: Any, reduce_op: int = 1, prescale: float = 1.0, postscale: float = 1.0,
            root: int = 0, process_set: int = 0, splits: Optional[Sequence[int]] = None,
            device: int = -1) -> int:
    """Submit one op; returns a handle. ``input_ptr``/``output_ptr`` are addresses (ints), or
    objects with the buffer protocol (numpy arrays; cheaper than ``array.ctypes.data``), or 0 /
    None for no output; the caller keeps them alive until wait() returned. ``name`` is the
    full tensor name (callers build
    ``allreduce.<name>`` / ``allreduce.noname.<n>``). allreduce and broadcast write
    ``output_ptr`` (which may equal ``input_ptr``); allgather/alltoall/reducescatter return a
    Buffer from wait(). Raises ValueError (duplicate in-flight name, bad splits, root out of
    range, process set unknown or not containing this rank), TypeError (dtype code invalid or
    not reducible by the op), HorovodInternalError (not initialised / core failed)."""

def enqueue_for_wait(kind: int, name: str, dtype: int, shape: Sequence[int], input_ptr: Any,
                     output_ptr: Any, reduce_op: int = 1, prescale: float = 1.0,
                     postscale: float = 1.0, root: int = 0, process_set: int = 0,
                     splits: Optional[Sequence[int]] = None, device: int = -1) -> int:
    """``enqueue()`` for an op whose ``wait()`` comes next: the core's thread is not woken and
    the wait runs the op on the calling thread (no hand-off between threads). An op that is
    never waited for still runs, within the core's 200 ms tick."""

def enqueue_group(ops: Sequence[tuple], waited: bool = False) -> list[int]:
    """Submit several ops (each a tuple of enqueue's positional arguments) atomically, so they
    are negotiated together and may fuse into one batch. ``waited``: as ``enqueue_for_wait``,
    for a caller that waits for every member next (in order); its waits drive the group."""

def poll(handle: int, free_name: bool = True) -> bool:
    """True when the op finished (successfully or not). Never blocks. A True answer also frees
    the op's tensor name for a new submission unless ``free_name`` is False (a name is taken
    until ``wait`` returns or ``poll`` answers True: Note [Name lifetime] in
    csrc/runtime/handle_table.h)."""

def wait(handle: int) -> Any:
    """Block (GIL released) until the op finishes; checks for signals every 50 ms so Ctrl-C
    raises KeyboardInterrupt here (the op stays pending; the caller usually calls abort()).
    Returns None (allreduce, broadcast, barrier), ``(Buffer, shape)`` (allgather,
    reducescatter), ``(Buffer, shape, received_splits)`` (alltoall), or the last joined global
    rank (join), ``(Buffer, shape, dtype code)`` (p2p_recv). Raises the op's error. The handle
    is released after a completed wait."""

def p2p_send(peer: int, tag: int, dtype: int, shape: Sequence[int], data: Any,
             wait_now: bool = False, device: int = -1, stream: int = 0) -> int:
    """Queue a point-to-point message to global rank ``peer`` (bindings/peer_api.cc); ``data``
    is an address or a C-contiguous buffer that must stay valid until the handle completes.
    ``device >= 0``: ``data`` is the address of a CUDA tensor on that device, produced on
    ``stream``, sent by CUDA IPC (a rank of this host only). Returns a handle; ``wait``
    returns None once the message is written (a CUDA tensor's: once it was copied out)."""

def p2p_recv(peer: int, tag: int, wait_now: bool = False, device: int = -1,
             on_device: bool = False, into: Any = None, into_dtype: int = 0,
             into_shape: Sequence[int] = ()) -> int:
    """Receive the next message with ``tag`` from global rank ``peer``; returns a handle whose
    ``wait`` returns ``(Buffer, shape, dtype code)``. ``device``: the CUDA device that reads
    a CUDA tensor sent from this host; ``on_device``: the result stays there. ``into``: host
    memory (an address, or a writable C-contiguous buffer) of ``into_dtype`` x ``into_shape``
    that a message of exactly that type is written to (``wait`` then gives None for the
    Buffer); the caller keeps it alive until the handle completes."""

def p2p_cuda_route(peer: int) -> str:
    """How a CUDA tensor travels to global rank ``peer``: ``"ipc"`` (CUDA IPC to a rank of this
    host), ``"staged"`` (through host memory, by the binding: another host, or
    ``HVD_GPU_PATH=staged``), ``""`` for no channel."""

# ---- the numpy API's per-tensor path (bindings/numpy_api.cc) --------------------------------

def numpy_setup(codes: dict, checked: Any, noname: Any, global_set: Any) -> None:
    """Configure allreduce_async below (engine_native.numpy_ops calls it at import): the
    {numpy dtype: dtype code} table, the checked Python path ``checked(array, op, full_name, prescale, postscale, process_set,
    waited) -> handle`` for everything the C path leaves to it, the noname-name function
    ``noname(kind, None, process_set) -> str`` and the global ProcessSet object."""

def output_like(array: Any) -> Any:
    """An uninitialised array like ``array`` for a result: from the output pools (one for small
    arrays, one for those of 1 MiB or more) when a pooled one is free, i.e. only the pool still
    references it (Note [Output array pools]); a fresh ``empty_like`` for a non-C-contiguous
    array."""

def output_pool_counts() -> dict:
    """``{"small_reused", "small_made", "large_reused", "large_made"}``: arrays each output
    pool handed out again, and made new, in this process."""

def allreduce_async(array: Any, op: int = 0, name: Optional[str] = None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: Any = None) -> int:
    """The numpy API's allreduce_async: a C-contiguous, aligned, native-order numpy array of a
    supported dtype goes straight to the core with a new output array; anything else is
    passed to the configured checked path. Returns a handle for poll()/synchronize()."""

def keep(handle: int, keepalive: Any, output: Any, finish: Any) -> None:
    """Hold references until synchronize(handle) returned (Note [Handle lifetime]): what the
    core reads or writes, the op's output, and ``finish(core_result)`` (None: return output)."""

def synchronize(handle: int) -> Any:
    """wait(handle), then the kept output, or finish(result); releases the kept references
    (kept after a KeyboardInterrupt: the op is still pending). A handle nothing was kept for
    returns wait()'s own result."""

# ---- the numpy API's aligned grouped allreduce (bindings/numpy_group.cc) --------------------

ALIGNMENT: int  # 64: the bytes a result view of aligned_like is aligned to

def aligned_like(arrays: Any) -> list:
    """Uninitialised, writable, C-contiguous views of one new buffer, shaped and typed as each
    of ``arrays`` (a list or tuple of numpy arrays, or of anything with ``dtype`` and
    ``shape``: a numpy scalar; no object dtype), each ALIGNMENT-byte aligned, carved in order
    (engine_native.aligned_buffers)."""

def grouped_allreduce_aligned(arrays: Any, op: int, name: Optional[str], prescale: float,
                              postscale: float, process_set: Any,
                              waited: bool) -> Optional[list]:
    """numpy_ops.grouped_allreduce_async(..., aligned=True) of a non-empty list or tuple of
    plain arrays (C-contiguous, aligned, native-order ndarrays of supported dtypes), an int op,
    float scales and a registered process set (None: the global set): named as the checked
    path names them, enqueued as one group into aligned_like views; returns the core handles,
    each synchronizing to its view. None, having named and enqueued nothing, for anything else
    (Note [Aligned group path])."""

def synchronize_group(handles: Any) -> list:
    """synchronize() of every handle, in order; a failed member does not stop the others'
    waits, and the first failure is raised after the last; an interrupt stops at once."""

# ---- engine_native.jax's host views (bindings/jax_host.cc) ------------------------------------

def jax_setup(array_type: type, sharding_type: type) -> None:
    """Configure jax_host_views (engine_native.jax.arrays calls it at import): jaxlib's
    ArrayImpl and jax.sharding.SingleDeviceSharding."""

def jax_host_views(values: Any) -> Optional[tuple]:
    """``(host views, devices)`` of a list or tuple of exact ArrayImpl objects of dtypes the
    numpy API's table has, each on one device by an exact SingleDeviceSharding, with
    C-contiguous host views (numpy's asarray); None for anything else, which
    arrays.host_views then checks (Note [Host views in C])."""

# ---- engine_native.jax's XLA FFI handlers (bindings/jax_ffi.cc) ------------------------------

def xla_ffi_targets() -> dict:
    """``{target name: PyCapsule of its XLA_FFI_Handler*}`` for jax.ffi.register_ffi_target
    (engine_native.jax.xla_ffi registers them at import); ``{}`` when the core was built without
    jaxlib's headers, and then the collectives inside jax.jit are ordered io_callbacks."""

# ---- waits inside jax.jit (bindings/jit_interrupt.cc) ----------------------------------------

def jit_callback_label(label: Optional[str]) -> None:
    """This thread's waits belong to the jitted op ``label`` (engine_native.jax's ordered
    io_callbacks set it around their host function) until ``None``: they check no Python
    signal, and a Ctrl-C (SIGINT) aborts the core instead (Note [Ctrl-C inside jax.jit])."""

def core_failure() -> Optional[tuple]:
    """None, or ``(message, what to do)`` of the failure (lost rank, timeout, abort) that every
    op fails with until shutdown()."""

def torch_setup(tensor_type: type, parameter_type: type, strided: Any, codes: dict,
                op_name: Any) -> None:
    """Configure torch_allreduce_async below (engine_native.torch.runtime calls it at import):
    the exact tensor types taken, torch.strided, the {torch dtype: dtype code} table and
    ``op_name(prefix, name, set_id)``, which names unnamed ops from the set's noname counter."""

def torch_allreduce_async(tensor: Any, output: Any, name: Optional[str], op: int,
                          prescale_factor: float, postscale_factor: float, set_id: int,
                          waited: bool) -> Optional[int]:
    """engine_native.torch's allreduce of an exact torch.Tensor/Parameter that is on the CPU,
    strided, contiguous and of a supported dtype, into ``output`` (``tensor`` itself in place):
    returns the handle, its tensors kept until torch_synchronize. Returns None, having named
    and enqueued nothing, for anything else (the torch layer's checked path decides)."""

def torch_synchronize(handle: int) -> Any:
    """synchronize() for a torch_allreduce_async handle: the output tensor (raises the op's
    error); None for a handle it does not hold (unknown or already synchronized)."""

def torch_release_kept() -> None:
    """Forget every torch_allreduce_async handle and drop its tensors (engine_native.torch's
    shutdown() and init())."""

def torch_kept(handle: int) -> bool:
    """True while a torch_allreduce_async handle has not been synchronized."""

def add_process_set(ranks: Sequence[int]) -> int:
    """Register a process set on this rank; every rank must make the same calls in the same
    order (ids are assigned by a counter). Returns the id (0 is the global set)."""

def remove_process_set(process_set: int) -> None: ...

def process_set_ranks(process_set: int) -> list[int]: ...

def metrics() -> dict:
    """Cheap snapshot: ops and bytes per op kind, fused batches, seconds negotiating /
    communicating, ``idle_seconds`` (the loop waiting for work; ``wait_seconds`` is the same
    value under its first name), ``handle_wait_seconds`` (framework threads blocked in
    wait()), ``main_blocked_seconds`` (how long the main thread has been blocked in its
    current wait(), 0 when it is not waiting), queue depth, last error, transport per peer; ``timeline`` (a timeline file is being
    written on this rank), ``timeline_dropped`` (events lost to a full ring), ``autotune`` (the
    dashboard's panel: {"enabled", "phase", "sample", "samples", "current", "best",
    "best_score", "scores": [[k, bytes/s], ...]}, or None when tuning never ran here) and
    ``events`` (collectives finished since the previous metrics() call in this process:
    [{"op", "name", "start_ago_s", "dur_s", "error"}, ...])."""

def config_table() -> list[tuple[str, Optional[str], str, str, str]]:
    """(name, horovod_alias, type, default, doc) for every HVD_* knob."""

# ---- timeline and autotune of the running core (bindings/timeline_autotune_live.cc) ----------

def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Rank 0 starts writing a Chrome-trace timeline to ``file_path`` (a running one is closed
    first); other ranks return at once. Blocks until the writer thread opened the file. Raises
    ValueError before init() or when the file cannot be opened."""

def stop_timeline() -> None:
    """Close the timeline file (valid JSON). No-op when none runs. ValueError before init()."""

def timeline_events(since_us: int = 0) -> list[tuple[int, str, str, str, int, str]]:
    """This rank's recent collectives (HVD_TIMELINE_LIVE), oldest first, one per response:
    ``(ts_us, name, phase, op, duration_us, error)`` with ts in microseconds since the epoch,
    phase "op" and op the collective (or ERROR)."""

def autotune_state() -> dict:
    """This rank's autotune state: enabled, tuner, phase, trial, trials, planned_settings,
    samples, current, best, best_score, history (rank 0), applied, applied_phase and switches
    (every rank: ``{"responses_before", "params", "phase"}``, identical across ranks)."""

def set_tuned_params(fusion_threshold_bytes: int, cycle_time_ms: float,
                     cache_enabled: bool = True, hierarchical_allreduce: bool = False) -> None:
    """Rank 0 stops tuning and sends these parameters with the next batch; every rank switches
    at the same point (no-op on other ranks). For benchmarks' grid searches."""

def set_autotune(enabled: bool) -> None:
    """Start (from the parameters in force) or stop (settling on the best scored setting) tuning
    on rank 0; other ranks follow through the response stream. ValueError before init()."""
