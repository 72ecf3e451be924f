"""A worker process on another host, started over ssh (elastic ``hvdrun``: a discovery script
may name hosts other than this machine).

Note [Remote worker lifetime]
ssh without a terminal gives the remote command no SIGHUP when the connection goes, so
killing the local ``ssh`` would leave the worker running on its host. The remote side is a
small shell wrapper instead: it starts the worker, and a watcher that waits for end-of-file on
the session's stdin and then sends the worker SIGTERM. Our end of that stdin is a pipe the
driver holds open while it wants the worker; closing it — deliberately, or because the driver
died — ends the worker. The wrapper exits with the worker's status (a signal N as 128 + N),
which ssh passes on. The watcher's output goes to /dev/null so that the session ends when the
worker does.
"""
from __future__ import annotations

import os
import re
import shlex

from .procs import spawn

__all__ = ["env_script", "forwarded_env", "remote_command", "spawn_remote"]

# What a process on another host gets of the job's environment (these workers, and mpiexec's
# ranks through hvd_magic.launch.mpi): the job's own variables and what Python, the frameworks
# and the GPU libraries read; never the rest of a login's environment (cloud tokens, keys).
# Names the user passes with --env go too, as with mpirun -x. docs/pages/jobs.md lists it.
_FORWARD_NAMES = frozenset({"PATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV"})
_FORWARD_PREFIXES = ("HVD_", "HOROVOD_", "PYTHON", "CUDA_", "NCCL_", "OMP_", "MKL_",
                     "OPENBLAS_", "TORCH_", "PYTORCH_")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def forwarded_env(env: dict, user_names=()) -> dict:
    """The part of ``env`` a remote worker gets: the allowlist above plus ``user_names`` (the
    job's --env names), if a shell can set them (not, e.g., bash's exported functions)."""
    return {k: v for k, v in env.items() if _NAME.match(k) and (
        k in user_names or k in _FORWARD_NAMES or k.startswith(_FORWARD_PREFIXES))}


def env_script(env: dict, user_names=()) -> bytes:
    """What the wrapper reads from its stdin before it starts the worker: one ``export`` per
    forwarded variable. Sent over the pipe, not the command line, so that the job's secret
    and the user's variables never show in a process listing on either host."""
    return "".join(f"export {k}={shlex.quote(v)}\n"
                   for k, v in sorted(forwarded_env(env, user_names).items())).encode()


def remote_command(host: str, cmd, env_bytes: int, cwd: str, ssh_port: int | None = None,
                   ssh_identity: str | None = None) -> list:
    """The local ``ssh`` command line that runs ``cmd`` in ``cwd`` on ``host`` inside the
    wrapper of Note [Remote worker lifetime], after reading ``env_bytes`` bytes of
    :func:`env_script` from its stdin."""
    worker = " ".join(shlex.quote(str(c)) for c in cmd)
    # A background job's stdin is /dev/null in a non-interactive shell: the watcher reads the
    # session's stdin through fd 3.
    script = (f"cd {shlex.quote(cwd)} || exit 127\n"
              f"vars=$(head -c {int(env_bytes)}) || exit 126\n"
              'eval "$vars"\n'
              "unset vars\n"
              "exec 3<&0\n"
              f"{worker} 3<&- &\n"
              "pid=$!\n"
              "(cat <&3 >/dev/null; kill -TERM $pid 2>/dev/null) >/dev/null 2>&1 &\n"
              "exec 3<&-\n"
              "wait $pid\n")
    ssh = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=30"]
    if ssh_port:
        ssh += ["-p", str(ssh_port)]
    if ssh_identity:
        ssh += ["-i", ssh_identity]
    return ssh + ["--", host, "sh -c " + shlex.quote(script)]


def spawn_remote(host: str, cmd, env: dict, cwd: str, ssh_port=None, ssh_identity=None,
                 user_names=()):
    """Start ``cmd`` on ``host`` with the forwarded part of ``env`` (``user_names``: the job's
    --env names); returns (the local ssh process, the fd that keeps the worker alive: close it
    to end the worker)."""
    keep_r, keep_w = os.pipe()
    variables = env_script(env, user_names)
    try:
        proc = spawn(remote_command(host, cmd, len(variables), cwd, ssh_port, ssh_identity),
                     dict(os.environ), stdin=keep_r)
    except OSError:
        os.close(keep_w)
        raise
    finally:
        os.close(keep_r)
    view = memoryview(variables)
    while view:  # ssh forwards it as the remote side reads: never blocks for long
        view = view[os.write(keep_w, view):]
    return proc, keep_w
