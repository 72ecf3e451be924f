"""This machine: a one-line description, and its memory ceilings (single-core copy and reduce).

The shm allreduce path can go no faster than memory: a single core copying 256 MiB bounds how
fast one rank can move its peer's bytes, and ``a += b`` bounds the reduction. Measured in the
launcher process with numpy (single-threaded), median of several repetitions.
"""

from __future__ import annotations

import os
import platform
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
    t.notes.append("memory-bound ideal for a 2-rank shm allreduce (reduce-scatter + allgather, "
                   "each core reduces S/2 and copies S/2): busbw ~= 2 / (1/reduce + 1/copy) "
                   f"= {2 / (1 / benchlib.median(add) + 1 / benchlib.median(copy)):.2f} GB/s")
    return t
