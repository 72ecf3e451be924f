"""Build and load ``_testhooks``, the test-only extension (tests/native/testhooks/*.cc): Python
handles on the core's Timeline, ParameterManager and GP/EI math, compiled here at test time
together with the core sources they run, never by setup.py, so nothing of it ships.

    from native.build_testhooks import load      # tests/ on sys.path (pytest's rootdir)
    hooks = load()                               # builds once, then reuses
    hooks.TimelineWriterForTest(flush_interval_ms=20)

    python tests/native/build_testhooks.py       # build now, print the module's path

The result lives in ``build/testhooks/<digest>/`` of the checkout (git-ignored), the digest
covering every source and header involved, the flags, the compiler and the Python: an
unchanged tree reuses it, a changed one builds anew (about 30 s on two cores, in parallel).
A failed build raises with the compiler's output: the hooks' tests fail, never skip.
``build_into`` and ``tree_digest`` are the same for other test-time builds (tests/fuzz).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CSRC = os.path.join(REPO, "engine_native", "csrc")
OUT = os.path.join(REPO, "build", "testhooks")

HOOKS = ["testhooks/module.cc", "testhooks/timeline_writer.cc", "testhooks/autotune.cc",
         "testhooks/device_kernels.cc", "testhooks/peer_block.cc", "testhooks/hmac.cc",
         "testhooks/byte_codec.cc", "testhooks/cpu_share.cc"]
# The core's sources the hooks run, spelled as in setup.py's CORE_SOURCES.
CORE = [
    "common/dtype.cc",
    "common/hmac.cc",
    "common/byte_codec.cc",
    "common/cpu_ranges.cc",
    "common/logging.cc",
    "timeline/trace_writer.cc",
    "timeline/recent_events.cc",
    "timeline/writer_thread.cc",
    "timeline/timeline.cc",
    "autotune/local_search.cc",
    "autotune/gaussian_process.cc",
    "autotune/bayesian_optimizer.cc",
    "autotune/parameter_manager.cc",
    "bindings/timeline_autotune.cc",
    "transport/dynamic_library.cc",
    "transport/nccl/loader.cc",
    "transport/cuda/kernel_libraries.cc",
    "transport/cuda/kernel_compiler.cc",
    "transport/cuda/reduce_kernel_source.cc",
    "transport/cuda/device_kernels.cc",
    "coord/key_table.cc",
    "coord/wire.cc",
    "coord/request_cache.cc",
    "coord/response_cache.cc",
    "coord/message.cc",
    "runtime/core_headroom.cc",
    "runtime/cpu_binding.cc",
]


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def _compiler() -> list:
    return (os.environ.get("CXX") or "c++").split()


def _flags() -> list:
    flags = ["-std=c++17", "-O2", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra", "-pthread",
             "-I" + CSRC, "-I" + HERE, "-I" + sysconfig.get_paths()["include"]]
    if _truthy("CI") or _truthy("HVD_WERROR"):  # as setup.py: warnings fail CI
        flags.append("-Werror")
    return flags


def _sources() -> list:
    return [os.path.join(HERE, s) for s in HOOKS] + [os.path.join(CSRC, s) for s in CORE]


def _digest() -> str:
    abi = [sys.version, sysconfig.get_config_var("EXT_SUFFIX")]
    return tree_digest(_sources(), _flags() + abi, (CSRC, HERE))


def tree_digest(sources: list, flags: list, header_roots) -> str:
    """Covers what a build reads: the sources, every header under ``header_roots`` they could
    include, the flags (and whatever else the caller adds to them) and the compiler's identity."""
    h = hashlib.sha256()
    headers = sorted(os.path.join(d, f) for top in header_roots for d, _, files in os.walk(top)
                     for f in files if f.endswith(".h"))
    for path in sources + headers:
        h.update(path.encode())
        with open(path, "rb") as fh:
            h.update(fh.read())
    version = subprocess.run(_compiler() + ["--version"], capture_output=True, text=True,
                             timeout=60, check=True).stdout
    h.update("\0".join(flags + [version]).encode())
    return h.hexdigest()[:16]


def _run(cmd: list) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"build failed: {' '.join(cmd)}\n{proc.stdout}{proc.stderr}")


def _precompiled(work: str, flags: list) -> list:
    """``-include`` args for the core's common/std_headers.h precompiled into ``work`` with
    ``flags``, as setup.py does (GCC only, else []): a quarter less compile time per source."""
    version = subprocess.run(_compiler() + ["--version"], capture_output=True, text=True,
                             timeout=60, check=False).stdout
    if "Free Software Foundation" not in version or "clang" in version:
        return []
    copy = os.path.join(work, "std_headers.h")
    with open(os.path.join(CSRC, "common", "std_headers.h")) as fh:  # GCC refuses the pragma
        text = "".join(line for line in fh if line.strip() != "#pragma once")
    with open(copy, "w") as fh:
        fh.write(text)
    proc = subprocess.run(_compiler() + flags + ["-x", "c++-header", copy, "-o", copy + ".gch"],
                          capture_output=True, text=True, timeout=600, check=False)
    return ["-include", copy] if proc.returncode == 0 else []


def build_into(out_root: str, digest: str, filename: str, sources: list, flags: list,
               link_flags: list) -> str:
    """``out_root/<digest>/<filename>``, compiled (in parallel) and linked unless it exists.
    Builds of other digests under ``out_root`` are removed: they are never used again."""
    target_dir = os.path.join(out_root, digest)
    target = os.path.join(target_dir, filename)
    if os.path.exists(target):
        return target
    os.makedirs(out_root, exist_ok=True)
    work = tempfile.mkdtemp(prefix="tmp-", dir=out_root)
    try:
        objects = [os.path.join(work, f"{i}.o") for i in range(len(sources))]
        flags = flags + _precompiled(work, flags)
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            list(pool.map(lambda pair: _run(_compiler() + flags + ["-c", pair[0], "-o", pair[1]]),
                          zip(sources, objects)))
        linked = os.path.join(work, filename)
        _run(_compiler() + link_flags + ["-o", linked] + objects)
        os.makedirs(target_dir, exist_ok=True)
        os.replace(linked, target)  # atomic: a concurrent build of the same tree is harmless
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for old in os.listdir(out_root):
        if old != digest and not old.startswith("tmp-"):
            shutil.rmtree(os.path.join(out_root, old), ignore_errors=True)
    return target


def build() -> str:
    """Path of an up-to-date _testhooks extension, building it when needed."""
    return build_into(OUT, _digest(), "_testhooks" + sysconfig.get_config_var("EXT_SUFFIX"),
                      _sources(), _flags(), ["-shared", "-pthread"])


@functools.cache
def load():
    """The _testhooks module (built if needed), imported once per process."""
    path = build()
    spec = importlib.util.spec_from_file_location("_testhooks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    print(build())
