"""Build of hvd-magic: the Python packages and the one C++ extension, ``engine_native._core``.

Metadata and dependencies live in pyproject.toml; this file holds what TOML cannot say:
- the explicit source list of the native core (no globs: a new .cc is added here on purpose),
- the package-dir mapping of the top-level ``kernel/`` and ``widgets/`` folders under
  ``hvd_magic`` (nothing generic is installed at top level; DESIGN §2),
- a build_ext that compiles in parallel (one job per core) and incrementally: objects live in
  ``build/cpp-<python tag>-<flags hash>/`` and are rebuilt only when their source or a header
  they include (from gcc's ``-MMD`` dependency files) changed, so ``pip install -e .`` after
  editing C++ rebuilds just that. With GCC the standard headers of ``common/std_headers.h``
  are precompiled once and force-included (``-include``).
"""
import hashlib
import os
import shlex
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join("engine_native", "csrc")

# One line per file, by folder in dependency order (common <- transport <- algo <- {timeline,
# autotune} <- coord <- runtime <- bindings); tests/unit/test_packaging.py checks it is complete.
CORE_SOURCES = [
    "common/dtype.cc",
    "common/logging.cc",
    "common/config.cc",
    "common/hmac.cc",
    "common/byte_codec.cc",
    "common/cpu_ranges.cc",
    "common/process_state.cc",
    "transport/mesh.cc",
    "transport/control.cc",
    "transport/peer_frame.cc",
    "transport/board_agreement.cc",
    "transport/peer_channel.cc",
    "transport/peer_split.cc",
    "transport/shm/ring_stream.cc",
    "transport/comm.cc",
    "transport/tcp/socket.cc",
    "transport/tcp/handshake.cc",
    "transport/tcp/acceptor.cc",
    "transport/tcp/pair.cc",
    "transport/shm/shared_mapping.cc",
    "transport/shm/segment.cc",
    "transport/shm/offer.cc",
    "transport/shm/setup.cc",
    "transport/shm/pair.cc",
    "transport/dynamic_library.cc",
    "transport/nccl/loader.cc",
    "transport/nccl/device_stream.cc",
    "transport/nccl/ordered_memory.cc",
    "transport/nccl/communicator.cc",
    "transport/cuda/kernel_libraries.cc",
    "transport/cuda/kernel_compiler.cc",
    "transport/cuda/reduce_kernel_source.cc",
    "transport/cuda/device_kernels.cc",
    "transport/cuda/ipc_messages.cc",
    "transport/cuda/ipc_peers.cc",
    "transport/shm/collective_segment.cc",
    "transport/shm/host_agreement.cc",
    "transport/shm/cross_memory.cc",
    "transport/shm/helper_read.cc",
    "transport/shm/shared_blocks.cc",
    "transport/shm/collective_sync.cc",
    "algo/reduce_worker.cc",
    "algo/allreduce_ring.cc",
    "algo/allreduce.cc",
    "algo/allreduce_shm.cc",
    "algo/allreduce_small.cc",
    "algo/host_layout.cc",
    "algo/allreduce_hierarchical.cc",
    "algo/adasum_kernels.cc",
    "algo/allreduce_adasum.cc",
    "algo/allgather.cc",
    "algo/allgather_ring.cc",
    "algo/allgather_shm.cc",
    "algo/alltoall.cc",
    "algo/alltoall_shm.cc",
    "algo/reducescatter_shm.cc",
    "algo/allgather_hierarchical.cc",
    "algo/broadcast.cc",
    "algo/broadcast_shm.cc",
    "algo/single_copy.cc",
    "algo/shared_outputs.cc",
    "algo/broadcast_hierarchical.cc",
    "algo/broadcast_tree.cc",
    "algo/alltoall_pairwise.cc",
    "algo/reducescatter_ring.cc",
    "algo/barrier.cc",
    "timeline/trace_writer.cc",
    "timeline/recent_events.cc",
    "timeline/writer_thread.cc",
    "timeline/timeline.cc",
    "autotune/local_search.cc",
    "autotune/gaussian_process.cc",
    "autotune/bayesian_optimizer.cc",
    "autotune/parameter_manager.cc",
    "coord/key_table.cc",
    "coord/message.cc",
    "coord/wire.cc",
    "coord/validation.cc",
    "coord/fusion.cc",
    "coord/coordinator.cc",
    "coord/request_cache.cc",
    "coord/response_cache.cc",
    "coord/stall_report.cc",
    "coord/deadlock.cc",
    "runtime/handle_table.cc",
    "runtime/process_sets.cc",
    "runtime/metrics.cc",
    "runtime/autotuner.cc",
    "runtime/batching_window.cc",
    "runtime/rank_zero_coordinator.cc",
    "runtime/ready_events.cc",
    "runtime/op_layout.cc",
    "runtime/cpu_executor.cc",
    "runtime/one_round_ops.cc",
    "runtime/one_round_post.cc",
    "runtime/one_round_respond.cc",
    "runtime/one_round.cc",
    "runtime/one_round_reopen.cc",
    "runtime/board_members.cc",
    "runtime/device_path.cc",
    "runtime/device_nccl_setup.cc",
    "runtime/device_output_pool.cc",
    "runtime/host_output_pool.cc",
    "runtime/device_loop_wake.cc",
    "runtime/device_held_op.cc",
    "runtime/device_ops.cc",
    "runtime/device_nccl_ops.cc",
    "runtime/device_staged_ops.cc",
    "runtime/device_solo_ops.cc",
    "runtime/device_ipc_steps.cc",
    "runtime/device_ipc_ops.cc",
    "runtime/device_mixed_ops.cc",
    "runtime/device_executor.cc",
    "runtime/executor.cc",
    "runtime/submission_queue.cc",
    "runtime/worker_requests.cc",
    "runtime/host_copy_streams.cc",
    "runtime/device_peer_ops.cc",
    "runtime/peer_ops.cc",
    "runtime/peer_ops_into.cc",
    "runtime/peer_await.cc",
    "runtime/core_headroom.cc",
    "runtime/cpu_binding.cc",
    "runtime/peer_ops_device.cc",
    "runtime/peer_ops_nccl.cc",
    "runtime/device_nccl_peers.cc",
    "runtime/peer_ops_shutdown.cc",
    "runtime/execution_queue.cc",
    "runtime/stall_inspector.cc",
    "runtime/loop_pass.cc",
    "runtime/loop_sleep.cc",
    "runtime/background_loop.cc",
    "runtime/enqueue_checks.cc",
    "runtime/runtime.cc",
    "bindings/metrics.cc",
    "bindings/timeline_autotune.cc",
    "bindings/timeline_autotune_live.cc",
    "bindings/nccl.cc",
    "bindings/enqueue_args.cc",
    "bindings/kept_table.cc",
    "bindings/buffer.cc",
    "bindings/numpy_fast_path.cc",
    "bindings/numpy_api.cc",
    "bindings/numpy_broadcast.cc",
    "bindings/numpy_gathers.cc",
    "bindings/numpy_group.cc",
    "bindings/jax_host.cc",
    "bindings/jax_ffi.cc",
    "bindings/jit_interrupt.cc",
    "bindings/group_core.cc",
    "bindings/output_array_pool.cc",
    "bindings/torch_api.cc",
    "bindings/torch_group.cc",
    "bindings/peer_api.cc",
    "bindings/module.cc",
]

# Python's own CFLAGS may carry C-only warnings that g++ rejects under -Werror.
_C_ONLY_FLAGS = {"-Wstrict-prototypes", "-Wimplicit-function-declaration",
                 "-Werror=implicit-function-declaration", "-std=c99", "-std=c11"}


def _truthy(name):
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def compile_args():
    args = ["-std=c++17", "-O3", "-Wall", "-Wextra", "-pthread", "-fvisibility=hidden"]
    if _truthy("CI") or _truthy("HVD_WERROR"):
        args.append("-Werror")
    if _truthy("CI"):
        # After Python's own -g: debug info is a quarter of the core's compile time on CI's
        # two cores, and nothing in CI reads it. Local builds keep it for gdb.
        args.append("-g0")
    if _truthy("HVD_TEST_SWITCHES"):  # the test build: common/test_switch.h
        args.append("-DHVD_TEST_SWITCHES")
    return args


def _jobs():
    env = os.environ.get("HVD_BUILD_JOBS", "")
    return int(env) if env.isdigit() and int(env) > 0 else (os.cpu_count() or 1)


def _deps_of(dep_file):
    """Files named in a gcc ``-MMD`` dependency file (target excluded)."""
    try:
        with open(dep_file) as fh:
            text = fh.read().replace("\\\n", " ")
    except OSError:
        return None
    _, _, rhs = text.partition(":")
    return shlex.split(rhs.replace("\\ ", "\0"))


def _stale(obj, src):
    if not os.path.exists(obj):
        return True
    deps = _deps_of(os.path.splitext(obj)[0] + ".d")
    if deps is None:
        return True
    mtime = os.path.getmtime(obj)
    for dep in [src] + [d.replace("\0", " ") for d in deps]:
        if not os.path.exists(dep) or os.path.getmtime(dep) > mtime:
            return True
    return False


def _is_gcc(driver):
    try:
        out = subprocess.run([driver[0], "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "Free Software Foundation" in out and "clang" not in out


def _precompiled_header(cc_args, obj_dir):
    """``-include`` args for common/std_headers.h, precompiled into ``obj_dir`` (GCC only; []
    for other compilers or when the header does not precompile). It declares standard names
    only, so objects need no rebuild when it changes (``-MMD`` files do not name it); sources
    still include what they use, and the wheel's clang build, which has no PCH, checks that.
    The .gch is made with the sources' flags, else GCC ignores it and parses the header."""
    if not _is_gcc(cc_args):
        return []
    header = os.path.join(ROOT, CSRC, "common", "std_headers.h")
    copy = os.path.join(obj_dir, "pch", "std_headers.h")
    with open(header) as fh:  # less its #pragma once, which GCC refuses in a main file
        text = "".join(line for line in fh if line.strip() != "#pragma once")
    old = None
    if os.path.exists(copy):
        with open(copy) as fh:
            old = fh.read()
    os.makedirs(os.path.dirname(copy), exist_ok=True)
    if old != text:
        with open(copy, "w") as fh:
            fh.write(text)
    gch = copy + ".gch"
    if not os.path.exists(gch) or os.path.getmtime(gch) < os.path.getmtime(copy):
        done = subprocess.run(cc_args + ["-x", "c++-header", copy, "-o", gch + ".tmp"],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print("engine_native._core: no precompiled header (building without one):\n"
                  + done.stderr[-2000:], flush=True)
            return []
        os.replace(gch + ".tmp", gch)
    return ["-include", copy]


class ParallelBuildExt(build_ext):
    """Compile every source of an extension on a thread pool; relink only when needed."""

    def build_extension(self, ext):
        missing = [s for s in ext.sources if not os.path.exists(s)]
        if missing:
            raise SystemExit("engine_native._core: listed sources do not exist: "
                             + ", ".join(missing) + " (edit CORE_SOURCES in setup.py)")
        flags = ext.extra_compile_args + ["-MMD"]
        compiler = self.compiler
        driver = getattr(compiler, "compiler_so_cxx", None) or compiler.compiler_so
        driver = [a for a in driver if a not in _C_ONLY_FLAGS]
        # One object folder per interpreter, compiler and flag set, so a CI build (-Werror), a
        # local one and the wheel's (zig's libc++, .ci/build-wheel.sh) never mix objects.
        tag = sysconfig.get_config_var("EXT_SUFFIX").strip(".").rsplit(".", 1)[0]
        digest = hashlib.sha1(" ".join([sys.version] + driver + flags).encode()).hexdigest()[:8]
        obj_dir = os.path.join(ROOT, "build", f"cpp-{tag}-{digest}")
        pairs = [(src, os.path.join(obj_dir, os.path.splitext(src)[0] + ".o"))
                 for src in ext.sources]
        todo = [(s, o) for s, o in pairs if self.force or _stale(o, s)]
        include_args = ["-I" + d for d in ext.include_dirs + self.include_dirs]
        cc_args = driver + include_args + flags
        cc_args += _precompiled_header(driver + include_args + ext.extra_compile_args, obj_dir)

        def compile_one(pair):
            src, obj = pair
            os.makedirs(os.path.dirname(obj), exist_ok=True)
            subprocess.check_call(cc_args + ["-c", src, "-o", obj])

        if todo:
            print(f"engine_native._core: compiling {len(todo)} of {len(pairs)} sources "
                  f"with {min(_jobs(), len(todo))} jobs", flush=True)
            with ThreadPoolExecutor(max_workers=_jobs()) as pool:
                list(pool.map(compile_one, todo))  # re-raises the first compile error
        ext_path = self.get_ext_fullpath(ext.name)
        objects = [o for _, o in pairs]
        # The object folder of the last link: a build with other flags (CI's -Werror, the test
        # switches) must relink even when its objects are older than the library.
        # One stamp per library path: the in-place copy and build/lib's are linked apart.
        where = hashlib.sha1(os.path.abspath(ext_path).encode()).hexdigest()[:8]
        stamp = os.path.join(ROOT, "build", f"cpp-{tag}-linked-{where}")
        linked_from = ""
        if os.path.exists(stamp):
            with open(stamp) as fh:
                linked_from = fh.read()
        if not todo and linked_from == obj_dir and os.path.exists(ext_path) and all(
                os.path.getmtime(o) <= os.path.getmtime(ext_path) for o in objects):
            return
        os.makedirs(os.path.dirname(ext_path), exist_ok=True)
        if os.path.exists(ext_path):  # else distutils skips a library newer than the objects
            os.remove(ext_path)
        compiler.link_shared_object(
            objects, ext_path, libraries=ext.libraries,
            library_dirs=ext.library_dirs + self.library_dirs,
            extra_postargs=ext.extra_link_args, target_lang="c++")
        with open(stamp, "w") as fh:
            fh.write(obj_dir)


def _mapped(folder, package):
    """Packages found under a top-level folder, renamed under ``package`` (kernel/ -> ...)."""
    found = find_packages(folder)
    names = [package] + [f"{package}.{sub}" for sub in found]
    dirs = {package: folder}
    dirs.update({f"{package}.{sub}": os.path.join(folder, *sub.split(".")) for sub in found})
    return names, dirs


packages = find_packages(include=["engine_native", "engine_native.*", "hvd_magic",
                                  "hvd_magic.*"])
package_dir = {}
for _folder, _package in (("kernel", "hvd_magic.kernel"), ("widgets", "hvd_magic.widgets"),
                          ("notebooks", "hvd_magic.notebooks")):
    _names, _dirs = _mapped(_folder, _package)
    packages += _names
    package_dir.update(_dirs)

def _numpy_include():
    # bindings/numpy_api.cc uses numpy's C API; numpy is a runtime and a build requirement.
    try:
        import numpy
    except ImportError:
        raise SystemExit("engine_native._core: numpy is needed to build the extension; "
                         "pip install 'numpy>=1.23' first (or build with build isolation)")
    return numpy.get_include()


def _jaxlib_include():
    # bindings/jax_ffi.cc's XLA FFI handlers (engine_native.jax inside jax.jit) compile against
    # jaxlib's xla/ffi/api/c_api.h when jaxlib is installed at build time (.ci/run installs the
    # frameworks first); without it the file compiles to an empty xla_ffi_targets() and jit
    # keeps the io_callback path (engine_native.jax.jit_path() says which).
    try:
        import jax.ffi
        folder = jax.ffi.include_dir()
    except Exception:  # not installed, or broken: build without the handlers
        return []
    return [folder] if os.path.exists(os.path.join(folder, "xla", "ffi", "api", "c_api.h")) else []


core = Extension(
    "engine_native._core",
    sources=[os.path.join(CSRC, s) for s in CORE_SOURCES],
    include_dirs=[CSRC, _numpy_include()] + _jaxlib_include(),
    extra_compile_args=compile_args(),
    extra_link_args=["-pthread"],
    libraries=["rt", "dl"],
    language="c++",
)

setup(
    packages=packages,
    package_dir=package_dir,
    # Exactly these data files, not every file of the sdist (the C++ sources stay out of the
    # wheel); the notebooks are what `python -m hvd_magic.demo` runs from an installed wheel.
    include_package_data=False,
    package_data={"engine_native": ["_core.pyi", "py.typed"],
                  "hvd_magic.notebooks": ["*.ipynb"]},
    ext_modules=[core],
    cmdclass={"build_ext": ParallelBuildExt},
    zip_safe=False,
)
