"""This machine: a one-line description, and its memory ceilings (single-core copy and reduce).

The shm allreduce path can go no faster than memory: a single core copying 256 MiB bounds how
fast one rank can move its peer's bytes, and ``a += b`` bounds the reduction. Measured in the
launcher process with numpy (single-threaded), median of several repetitions. The
``process_vm_readv`` row is the ceiling of HVD_SINGLE_COPY's reads (one process reading another's
memory through the kernel), measured against a forked child.
"""

from __future__ import annotations

import ctypes
import os
import platform
import signal
import time

import benchlib
from benchlib import MIB, Table


def _cpuinfo() -> dict:
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if not line.strip():
                    break
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return info


def _read(path: str, default: str = "?") -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def describe() -> str:
    info = _cpuinfo()
    mem_kb = int(_read("/proc/meminfo", "MemTotal: 0 kB").split()[1])
    l3 = _read("/sys/devices/system/cpu/cpu0/cache/index3/size")
    guest = " (VM guest)" if "hypervisor" in info.get("flags", "").split() else ""
    return (f"{info.get('model name', '?')} family {info.get('cpu family', '?')} model "
            f"{info.get('model', '?')}{guest}, {os.cpu_count()} logical cores, L3 {l3}, "
            f"{mem_kb / (1 << 20):.0f} GiB RAM, Linux {platform.release()}")


def _rates(fn, nbytes_moved: int, reps: int) -> list:
    fn()
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        rates.append(nbytes_moved / (time.perf_counter() - t0) / 1e9)
    return rates


def _measure(size: int, reps: int) -> tuple:
    import numpy as np

    src = np.ones(size // 4, dtype=np.float32)
    dst = np.empty_like(src)
    copy = _rates(lambda: np.copyto(dst, src), size, reps)
    fresh = _rates(lambda: np.copyto(np.empty_like(src), src), size, max(3, reps // 2))
    a = np.ones(16 * MIB, dtype=np.float32)  # 64 MiB each
    b = np.ones_like(a)
    add = _rates(lambda: np.add(a, b, out=a), a.nbytes, reps)
    return copy, add, fresh


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _cross_process_rates(size: int, reps: int):
    """GB/s of process_vm_readv(2) copying ``size`` bytes out of a forked child, or the error
    text where the kernel refuses (seccomp, Yama ptrace_scope) or the fork fails."""
    import numpy as np

    libc = ctypes.CDLL(None, use_errno=True)
    try:
        readv = libc.process_vm_readv
    except AttributeError:
        return "unavailable: this C library has no process_vm_readv"
    readv.restype = ctypes.c_ssize_t
    readv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p,
                      ctypes.c_ulong, ctypes.c_ulong]
    src = np.ones(size, dtype=np.uint8)  # the child's copy sits at the same address
    dst = np.zeros_like(src)
    release_r, release_w = os.pipe()
    try:
        child = os.fork()
    except OSError as e:
        os.close(release_r)
        os.close(release_w)
        return f"unavailable: fork failed ({e.strerror})"
    if child == 0:  # waits for the parent's byte or its exit (EOF), whatever signal comes
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.close(release_w)
            os.read(release_r, 1)
        finally:
            os._exit(0)
    os.close(release_r)
    try:
        local, remote = _IoVec(dst.ctypes.data, size), _IoVec(src.ctypes.data, size)

        def read() -> None:
            done = readv(child, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
            if done < 0:
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
            if done != size:
                raise OSError(0, f"a partial read ({done} of {size} bytes)")

        return _rates(read, size, reps)
    except OSError as e:
        return f"unavailable: {e.strerror}"
    finally:
        os.write(release_w, b"x")
        os.close(release_w)
        os.waitpid(child, 0)


def memcpy_table(ctx) -> Table:
    reps = 3 if ctx.quick else 10
    size = 16 * MIB if ctx.smoke else (64 * MIB if ctx.quick else 256 * MIB)
    copy, add, fresh = _measure(size, reps)
    t = Table("this machine's memory ceilings (one core, numpy, median [min-max] GB/s)",
              ["measure", "GB/s", "read+write GB/s"])
    fresh_label = f"copy {benchlib.fmt_bytes(size)} into a fresh np.empty (page faults)"
    for label, rates, mult in ((f"copy {benchlib.fmt_bytes(size)} (payload)", copy, 2),
                               ("`a += b` 64 MiB (bytes of b reduced)", add, 3),
                               (fresh_label, fresh, 2)):
        med = benchlib.median(rates)
        t.add(label, f"{med:.2f} [{min(rates):.2f}-{max(rates):.2f}]", f"{med * mult:.2f}")
        ctx.figures[("memcpy", label.split()[0] if "fresh" not in label else "fresh")] = med
    cross = _cross_process_rates(size, reps)
    cross_label = f"process_vm_readv {benchlib.fmt_bytes(size)} from another process"
    if isinstance(cross, str):
        t.add(cross_label, cross, "-")
    else:
        med = benchlib.median(cross)
        t.add(cross_label, f"{med:.2f} [{min(cross):.2f}-{max(cross):.2f}]", f"{med * 2:.2f}")
        ctx.figures[("memcpy", "process_vm_readv")] = med
    t.notes.append("memory-bound ideal for a 2-rank shm allreduce (reduce-scatter + allgather, "
                   "each core reduces S/2 and copies S/2): busbw ~= 2 / (1/reduce + 1/copy) "
                   f"= {2 / (1 / benchlib.median(add) + 1 / benchlib.median(copy)):.2f} GB/s")
    return t
