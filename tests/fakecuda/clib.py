"""ctypes bindings of the fake CUDA runtime and NCCL, for tests (in a rank or a fresh process).

:class:`Fakes` loads both libraries (once per process), types every entry point, and offers a
few conveniences: :meth:`Fakes.check` turns a nonzero result into an AssertionError,
:meth:`Fakes.malloc` / :meth:`Fakes.put` / :meth:`Fakes.get` move bytes in and out of "device"
memory (host memory in the fake), :meth:`Fakes.comm` creates a communicator.

Example
-------
>>> f = Fakes(cudart_path, nccl_path)                         # doctest: +SKIP
>>> buf = f.malloc(16); f.put(buf, b"x" * 16); f.get(buf, 16)  # doctest: +SKIP
"""
from __future__ import annotations

import ctypes
import threading
import time
from ctypes import POINTER, c_char_p, c_int, c_long, c_size_t, c_uint, c_void_p

HOST_FN = ctypes.CFUNCTYPE(None, c_void_p)
NOT_READY = 600
# ncclDataType_t -> numpy dtype name (bfloat16 from ml_dtypes)
NCCL_DTYPES = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32",
               "float64", "bfloat16")
NCCL_OPS = ("sum", "prod", "max", "min", "avg")


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


class IpcHandle(ctypes.Structure):
    """cudaIpcMemHandle_t / cudaIpcEventHandle_t: 64 opaque bytes, passed by value."""
    _fields_ = [("reserved", ctypes.c_char * 64)]


_CUDA = {
    "cudaRuntimeGetVersion": [POINTER(c_int)], "cudaDriverGetVersion": [POINTER(c_int)],
    "cudaGetDeviceCount": [POINTER(c_int)], "cudaGetDevice": [POINTER(c_int)],
    "cudaSetDevice": [c_int], "cudaDeviceGetPCIBusId": [c_char_p, c_int, c_int],
    "cudaDeviceSynchronize": [],
    "cudaStreamCreateWithFlags": [POINTER(c_void_p), c_uint],
    "cudaStreamDestroy": [c_void_p], "cudaStreamSynchronize": [c_void_p],
    "cudaStreamWaitEvent": [c_void_p, c_void_p, c_uint],
    "cudaEventCreateWithFlags": [POINTER(c_void_p), c_uint],
    "cudaEventRecord": [c_void_p, c_void_p], "cudaEventQuery": [c_void_p],
    "cudaEventSynchronize": [c_void_p], "cudaEventDestroy": [c_void_p],
    "cudaMalloc": [POINTER(c_void_p), c_size_t], "cudaFree": [c_void_p],
    "cudaMallocHost": [POINTER(c_void_p), c_size_t], "cudaFreeHost": [c_void_p],
    "cudaMallocAsync": [POINTER(c_void_p), c_size_t, c_void_p],
    "cudaFreeAsync": [c_void_p, c_void_p],
    "cudaMemcpyAsync": [c_void_p, c_void_p, c_size_t, c_int, c_void_p],
    "cudaMemsetAsync": [c_void_p, c_int, c_size_t, c_void_p],
    "cudaLaunchHostFunc": [c_void_p, HOST_FN, c_void_p],
    "cudaStreamIsCapturing": [c_void_p, POINTER(c_int)], "fakeCudaSetCapture": [c_void_p, c_int],
    "fakeCudaLaunchDelayedFill": [c_void_p, c_int, c_size_t, c_int, c_void_p],
    "cudaIpcGetMemHandle": [POINTER(IpcHandle), c_void_p],
    "cudaIpcOpenMemHandle": [POINTER(c_void_p), IpcHandle, c_uint],
    "cudaIpcCloseMemHandle": [c_void_p],
    "cudaIpcGetEventHandle": [POINTER(IpcHandle), c_void_p],
    "cudaIpcOpenEventHandle": [POINTER(c_void_p), IpcHandle],
}
_CUDA_LONG = {"fakeCudaLaunchBlocker": [c_void_p], "fakeCudaLiveAllocations": [],
              "fakeCudaLiveHostAllocations": [], "fakeCudaLiveStreams": [],
              "fakeCudaLiveEvents": [], "fakeCudaCalls": [c_char_p],
              "fakeCudaLiveIpcMappings": [], "fakeCudaFreedWhileMapped": [],
              "fakeCudaIpcEventWaits": [], "fakeCudaStreamParked": [c_void_p]}
_COLL = [c_void_p, c_void_p, c_size_t, c_int]  # send, recv, count, dtype
_NCCL = {
    "ncclGetVersion": [POINTER(c_int)], "ncclGetUniqueId": [POINTER(UniqueId)],
    "ncclCommInitRank": [POINTER(c_void_p), c_int, UniqueId, c_int],
    "ncclCommDestroy": [c_void_p], "ncclCommAbort": [c_void_p],
    "ncclCommGetAsyncError": [c_void_p, POINTER(c_int)],
    "ncclAllReduce": _COLL + [c_int, c_void_p, c_void_p],
    "ncclBroadcast": _COLL + [c_int, c_void_p, c_void_p],
    "ncclReduce": _COLL + [c_int, c_int, c_void_p, c_void_p],
    "ncclAllGather": _COLL + [c_void_p, c_void_p],
    "ncclReduceScatter": _COLL + [c_int, c_void_p, c_void_p],
    "ncclSend": [c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p],
    "ncclRecv": [c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p],
    "ncclGroupStart": [], "ncclGroupEnd": [],
    "ncclRedOpCreatePreMulSum": [POINTER(c_int), c_void_p, c_int, c_int, c_void_p],
    "ncclRedOpDestroy": [c_int, c_void_p],
}


def _type(lib, table, restype):
    for name, args in table.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, restype


class Fakes:
    """Both fake libraries, typed. ``cuda`` and ``nccl`` are the ctypes.CDLL objects."""

    def __init__(self, cudart: str, nccl: str):
        self.cuda = ctypes.CDLL(cudart)
        self.nccl = ctypes.CDLL(nccl)
        _type(self.cuda, _CUDA, c_int)
        _type(self.cuda, _CUDA_LONG, c_long)
        self.cuda.fakeCudaReleaseBlocker.argtypes = [c_long]
        self.cuda.cudaGetErrorString.argtypes, self.cuda.cudaGetErrorString.restype = \
            [c_int], c_char_p
        _type(self.nccl, _NCCL, c_int)
        self.nccl.ncclGetErrorString.argtypes, self.nccl.ncclGetErrorString.restype = \
            [c_int], c_char_p
        for name in ("fakeNcclCollectives", "fakeNcclLiveComms"):
            getattr(self.nccl, name).restype = c_long

    @staticmethod
    def check(result: int, what: str = "call") -> None:
        assert result == 0, f"{what} returned {result}"

    def settled(self, *streams, timeout: float = 30.0) -> None:
        """Return once every stream's worker sleeps (Note [Parked streams] in
        fake_cudart_stream.c): what could run on them has run, what is held stays held. In
        place of a sleep before checking that held work is still held."""
        deadline = time.monotonic() + timeout
        for s in streams:
            while (parked := self.cuda.fakeCudaStreamParked(s)) != 1:
                assert parked == 0, f"stream {s}: fakeCudaStreamParked returned {parked}"
                assert time.monotonic() < deadline, f"stream {s} still running after {timeout} s"
                threading.Event().wait(0.001)  # a bounded poll, not a nap

    def calls(self, api: str) -> int:
        return self.cuda.fakeCudaCalls(api.encode())

    def live(self) -> dict:
        c = self.cuda
        return {"device": c.fakeCudaLiveAllocations(), "host": c.fakeCudaLiveHostAllocations(),
                "streams": c.fakeCudaLiveStreams(), "events": c.fakeCudaLiveEvents(),
                "comms": self.nccl.fakeNcclLiveComms()}

    def malloc(self, nbytes: int) -> int:
        ptr = c_void_p()
        self.check(self.cuda.cudaMalloc(ctypes.byref(ptr), nbytes), "cudaMalloc")
        return ptr.value or 0

    def stream(self, flags: int = 1) -> int:
        s = c_void_p()
        self.check(self.cuda.cudaStreamCreateWithFlags(ctypes.byref(s), flags), "stream")
        return s.value

    def event(self, flags: int = 2) -> int:
        e = c_void_p()
        self.check(self.cuda.cudaEventCreateWithFlags(ctypes.byref(e), flags), "event")
        return e.value

    def ipc_handle(self, pointer_or_event: int, event: bool = False) -> bytes:
        """The 64-byte IPC handle of device memory (or of an interprocess event)."""
        h = IpcHandle()
        fn = self.cuda.cudaIpcGetEventHandle if event else self.cuda.cudaIpcGetMemHandle
        self.check(fn(ctypes.byref(h), pointer_or_event), "cudaIpcGet*Handle")
        return ctypes.string_at(ctypes.addressof(h), 64)

    def ipc_open(self, handle: bytes, event: bool = False):
        """(result, pointer or event) of cudaIpcOpenMemHandle / cudaIpcOpenEventHandle."""
        out = c_void_p()
        h = IpcHandle.from_buffer_copy(handle)
        result = (self.cuda.cudaIpcOpenEventHandle(ctypes.byref(out), h) if event
                  else self.cuda.cudaIpcOpenMemHandle(ctypes.byref(out), h, 1))
        return result, out.value or 0

    @staticmethod
    def put(ptr: int, data: bytes) -> None:
        """Host write into fake device memory (it is host memory)."""
        ctypes.memmove(ptr, data, len(data))

    @staticmethod
    def get(ptr: int, nbytes: int) -> bytes:
        return ctypes.string_at(ptr, nbytes) if nbytes else b""

    def unique_id(self) -> bytes:
        uid = UniqueId()
        self.check(self.nccl.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        return ctypes.string_at(ctypes.addressof(uid), ctypes.sizeof(uid))

    def init_rank(self, uid: bytes, nranks: int, rank: int):
        """(result, comm handle) of ncclCommInitRank."""
        comm = c_void_p()
        result = self.nccl.ncclCommInitRank(ctypes.byref(comm), nranks,
                                            UniqueId.from_buffer_copy(uid), rank)
        return result, comm.value

    def comm(self, uid: bytes, nranks: int, rank: int) -> int:
        result, comm = self.init_rank(uid, nranks, rank)
        self.check(result, "ncclCommInitRank")
        return comm

    def async_error(self, comm: int) -> int:
        out = c_int(-1)
        self.check(self.nccl.ncclCommGetAsyncError(comm, ctypes.byref(out)), "asyncError")
        return out.value
