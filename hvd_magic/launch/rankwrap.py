"""``python -m hvd_magic.launch.rankwrap -- CMD...``: one rank under mpiexec, output tagged.

mpiexec's own labels (hydra's ``-l``) are attached per chunk read, not per line, so lines of
different ranks can run together. This wrapper runs CMD as the rank (it keeps the MPI
environment and the PMI file descriptors, so CMD bootstraps through MPI as usual), writes
each whole line of CMD's output as ``[rank]<stdout>:line`` / ``[rank]<stderr>:line`` in one
write, and finally ``[rank]<exit>:code`` on stderr, which the launcher's MpiJob turns into
"rank r failed". SIGTERM/SIGINT/SIGHUP are passed on to CMD's process group; CMD dies with
the wrapper (PR_SET_PDEATHSIG).

Before CMD starts, its environment gets this rank's GPU (hvd_magic.gpu_pinning.pin, from the
local rank mpiexec gives: MPICH's MPI_LOCALRANKID, Open MPI's OMPI_COMM_WORLD_LOCAL_RANK);
local rank 0 says once per host when ranks share GPUs.
"""

from __future__ import annotations

import os
import signal
import sys

from . import config
from .output import RankOutput
from .procs import ProcessJob, exit_status, spawn

_RANK_VARS = ("HVD_RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
_FD_VARS = ("PMI_FD", "HYDI_CONTROL_FD")


class _Tagger(ProcessJob):
    def handle_line(self, key, stream: str, text: str) -> None:
        out = sys.stdout if stream == "stdout" else sys.stderr
        out.write(f"[{key}]<{stream}>:{text}\n")
        out.flush()

    def handle_exit(self, key, code: int) -> None:
        self.result.codes[key] = code
        sys.stderr.write(f"[{key}]<exit>:{code}\n")
        sys.stderr.flush()


def _rank() -> int:
    for name in _RANK_VARS:
        value = os.environ.get(name)
        if value and value.isdigit():
            return int(value)
    return 0


def _inherited_fds() -> tuple:
    fds = []
    for name in _FD_VARS:
        value = os.environ.get(name, "")
        if value.isdigit():
            try:
                os.fstat(int(value))
                fds.append(int(value))
            except OSError:
                pass
    return tuple(fds)


def _pin_gpu(rank: int, env: dict) -> None:
    from .. import gpu_pinning

    position = gpu_pinning.local_position(env)
    if position is None:
        return
    local_rank, local_size = position
    config.share_threads(env, local_size)
    say = (lambda text: sys.stderr.write(f"[{rank}]<stderr>:hvdrun: {text}\n")) \
        if local_rank == 0 else None
    gpu_pinning.pin(local_rank, local_size, environ=env, sharing=say)
    gpu_pinning.child_env(env)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        sys.stderr.write("usage: python -m hvd_magic.launch.rankwrap -- CMD [ARGS...]\n")
        return 2
    rank = _rank()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    _pin_gpu(rank, env)
    job = _Tagger(RankOutput(), grace=3.0)
    try:
        proc = spawn(argv, env, pass_fds=_inherited_fds())
    except OSError as exc:
        sys.stderr.write(f"[{rank}]<stderr>:hvdrun: cannot start {argv[0]!r}: {exc}\n"
                         f"[{rank}]<exit>:127\n")
        return 127
    job.add(rank, proc)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: job.stop(f"signal {signum}"))
    try:
        result = job.run()
    except KeyboardInterrupt:
        return 130
    return exit_status(result.codes.get(rank))


if __name__ == "__main__":
    sys.exit(main())
