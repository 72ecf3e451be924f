"""The zygote's process: imports what most ranks import, then forks a rank per request.

Started by :class:`zygote.Zygote` (the test process's end, where the protocol and what a
forked rank is and is not are written down) as ``python zygote_server.py FD PARENT``: ``FD`` is
its end of the socketpair, ``PARENT`` the test process, whose exit ends it. A forked child
leaves :func:`serve` with its request, runs the rank as ``python harness.py`` would, and ends
with :func:`exit_after_python`. :func:`die_with` serves a cold rank too (the harness calls it).
"""
from __future__ import annotations

import atexit
import ctypes
import gc
import os
import pickle
import select
import signal
import socket
import struct
import sys
import threading
import traceback
import weakref
from typing import Optional

HERE = os.path.dirname(os.path.abspath(__file__))
# What most ranks import: ml_dtypes and pytest (tests/multiproc/checks.py), torch._dynamo (torch's
# optimizers import it on their first step).
PRELOAD = ("numpy", "ml_dtypes", "torch", "torch._dynamo", "pytest")
_REAL_CUDA = ("libcudart.so", "libcuda.so", "libnccl.so", "libnvrtc.so")


def _cuda_mapped() -> bool:
    with open("/proc/self/maps") as maps:
        return any(name in line for line in maps for name in _REAL_CUDA)


# Messages: a little-endian 4-byte length, then a pickle; the test process is the only peer.
def send(sock: socket.socket, message: dict) -> None:
    data = pickle.dumps(message)
    sock.sendall(struct.pack("<I", len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> Optional[bytes]:
    chunks = []
    while n:
        chunk = sock.recv(n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def receive(sock: socket.socket) -> Optional[dict]:
    header = _recv_exact(sock, 4)
    if header is None:
        return None
    body = _recv_exact(sock, struct.unpack("<I", header)[0])
    return None if body is None else pickle.loads(body)


def die_with(parent: int) -> None:
    """SIGKILL this process when ``parent`` exits; exit now if it already has (the zygote
    with the test process, a rank with whoever started it)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it died before the prctl
        os._exit(1)


def exit_after_python(code: int) -> None:
    """The interpreter's exit (``threading._shutdown``: its hooks, e.g. idle ThreadPoolExecutor
    workers stopped, then threads joined; atexit; streams flushed) without the C library's:
    what that runs for torch's libraries takes ~0.3 s of CPU a process (a forked child with
    torch: 310-420 ms from exit to reaped, 65-95 ms this way). The fake CUDA libraries clean
    up in destructors, which _exit skips: their cleanup is called here instead."""
    threading._shutdown()  # what Py_FinalizeEx runs first; no public equivalent
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed by the test, or its reader went away
            pass
    ctypes.CDLL(None).fflush(None)  # C stdio buffers (a core's printf) as exit() would
    _fake_libraries_cleanup()
    os._exit(code)


# What the fake libraries' destructors do (tests/fakecuda): the fake NCCL leaves its open
# communicators (the last member out removes their folder), the fake NVRTC removes its folders.
_FAKE_CLEANUPS = (("HVD_NCCL_LIBRARY", "fakenccl_leave_all"),
                  ("HVD_NVRTC_LIBRARY", "fakenvrtc_remove_folders"))


def _fake_libraries_cleanup() -> None:
    for variable, function in _FAKE_CLEANUPS:
        path = os.environ.get(variable)
        if not path:
            continue
        try:  # RTLD_NOLOAD: only a library this rank loaded
            library = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_NOW)
        except OSError:
            continue
        cleanup = getattr(library, function, None)  # absent from a real library
        if cleanup is not None:
            cleanup()


def _become_rank(request: dict, sock: socket.socket, wake_fds: tuple, ready_fd: int) -> None:
    """In the forked child: detach from the zygote and look like a freshly started rank."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    sock.close()
    for fd in wake_fds:
        os.close(fd)
    os.setsid()
    os.close(ready_fd)  # the zygote answers "spawned" only now: the group exists
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY),
                            (1, request["stdout"], os.O_WRONLY | os.O_APPEND),
                            (2, request["stderr"], os.O_WRONLY | os.O_APPEND)):
        new = os.open(path, flags)
        os.dup2(new, fd)
        os.close(new)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.argv = list(request["argv"])
    import numpy
    import torch

    numpy.random.seed()  # a cold rank seeds both from the OS: forked ones must not share them
    torch.seed()


def _fork(request: dict, sock: socket.socket, wake_fds: tuple) -> int:
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        try:
            _become_rank(request, sock, wake_fds, ready_w)
        except BaseException:  # to the rank's stderr file when it got that far
            traceback.print_exc()
            os._exit(1)
        return 0
    os.close(ready_w)
    os.read(ready_r, 1)  # EOF once the child has its session (or died trying)
    os.close(ready_r)
    return pid


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        send(sock, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def serve(fd: int, parent: int) -> Optional[dict]:
    """The zygote's loop; returns only in a forked child, with the request it is to run."""
    die_with(parent)
    sock = socket.socket(fileno=fd)
    for name in PRELOAD:
        __import__(name)
    sys.path.insert(0, os.path.dirname(HERE))  # as the rank's harness imports it
    from multiproc import checks

    del sys.path[0]
    checks.warm()  # the test inputs' tables, shared with every rank forked from here
    # The preloaded modules' finalizers would run at every rank's exit (torch's Library objects
    # deregister their operators: ~60 ms a rank), for objects the rank only inherited.
    for finalizer in list(getattr(weakref.finalize, "_registry", ())):
        finalizer.atexit = False
    gc.freeze()  # a rank's collections then leave the preloaded objects' pages shared
    threads = len(os.listdir("/proc/self/task"))
    send(sock, {"ready": os.getpid(), "threads": threads, "cuda_mapped": _cuda_mapped()})
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    while True:
        try:
            readable, _, _ = select.select([sock, wake_r], [], [])
        except InterruptedError:
            continue
        if wake_r in readable:
            while True:
                try:
                    if not os.read(wake_r, 512):
                        break
                except BlockingIOError:
                    break
            _reap(sock)
        if sock in readable:
            request = receive(sock)
            if request is None:
                return None
            if threads != 1:
                send(sock, {"error": f"the zygote has {threads} threads: it must not fork"})
                continue
            pid = _fork(request, sock, (wake_r, wake_w))
            if pid == 0:
                return request
            send(sock, {"spawned": pid})


if __name__ == "__main__":
    job = serve(int(sys.argv[1]), int(sys.argv[2]))
    if job is None:
        sys.exit(0)
    sys.path[0] = HERE  # as for `python harness.py`: the harness's folder first
    import harness

    exit_after_python(harness._child_main(job["argv"][1], job["argv"][2]))
