"""``hvdrun``: horovodrun's command line on this project's core.

::

    hvdrun -np 4 python train.py --epochs 2
    hvdrun -np 4 -H localhost:2,127.0.0.1:2 --timeline-filename tl.json python train.py
    hvdrun -np 8 -H node1:4,node2:4 python train.py      # through mpiexec + ssh
    hvdrun -np 4 --min-np 2 --max-np 4 python train.py   # elastic (elastic_driver)

Ranks on this machine are child processes that bootstrap through an authenticated rendezvous
store run by hvdrun (``HVD_RANK``, ``HVD_SIZE``, ``HVD_RENDEZVOUS``, ``HVD_SECRET``, ...). A host
list naming other machines (or ``--mpi``) runs the ranks through mpiexec instead (see
hvd_magic.launch.mpi). Output lines are tagged ``[rank]<stdout>:``; the first rank that fails
stops the others, after a short window in which they may exit with errors of their own
(hvd_magic.launch.procs, Note [Report window]), and hvdrun exits with its code after showing
its traceback (or, for a killed rank, its peers' errors). The flags, and
the environment and host list they make, are in hvd_magic.launch.hvdrun_args.
"""

from __future__ import annotations

import os
import secrets
import shlex
import signal
import sys
import time
import uuid

from .. import gpu_pinning
from . import config
from . import elastic_driver
from . import hosts as hostlib
from . import mps as mpslib
from .mpi import MpiJob, build_command, find_mpiexec, mpi_flavor
from .output import RankOutput, traceback_tail
from .hvdrun_args import build_parser, env_from_args, host_list
from .procs import JobResult, ProcessJob, exit_status, spawn

__all__ = ["build_parser", "main"]


def check_build() -> str:
    from .. import frameworks

    def mark(ok: bool) -> str:
        return "[X]" if ok else "[ ]"
    mpiexec = find_mpiexec()
    bindings = [f"    {mark(frameworks.missing(name) is None)} {f.label} ({f.binding})"
                for name, f in frameworks.FRAMEWORKS.items()]
    return "\n".join([
        "hvd-magic: available frameworks, controllers and transports", "",
        "Available Frameworks:", *bindings, "",
        "Available Controllers:", "    [X] rendezvous (hvdrun, Gloo-like)",
        f"    {mark(mpiexec is not None)} MPI ({mpiexec or 'mpiexec not found'})", "",
        "Available Tensor Operations:", "    [X] shm (same host)", "    [X] TCP",
        "    [ ] NCCL (loaded at run time when CUDA tensors are used)"])


def root_cause(output: RankOutput, result: JobResult, size: int) -> int | None:
    """The rank to blame: the first to fail, unless it only lost a peer (HorovodInternalError)
    while another rank printed a traceback of its own error. A first rank killed by a signal
    (hvdrun had sent none yet: procs.py Note [Report window]) is the cause, whatever its peers
    then raised about losing it."""
    first = result.failed
    if first is None:
        return None

    def own_error(rank: int) -> bool:
        lines = traceback_tail(output.tail(rank))
        return bool(lines) and lines[0].startswith("Traceback") and \
            "HorovodInternalError" not in lines[-1]
    if own_error(first) or (result.codes.get(first) or 0) < 0:
        return first
    others = [r for r in range(size) if r != first and own_error(r)]
    return others[0] if others else first


def _others(result: JobResult, size: int) -> str:
    """What became of the ranks other than the first failed one: exited by themselves (in the
    report window) or stopped by hvdrun."""
    others = size - 1
    stopped = len([k for k in result.stopped if k != result.failed])
    alone = others - stopped

    def ranks(n: int) -> str:
        return f"{n} rank{'s' if n != 1 else ''}"
    if not others:
        return ""
    if not alone:
        return f"; stopped the other {ranks(others)}"
    if not stopped:
        return f"; the other {ranks(others)} exited by themselves"
    return f"; {ranks(alone)} exited by themselves, stopped the other {ranks(stopped)}"


def _report_failure(output: RankOutput, result: JobResult, size: int) -> None:
    if result.failed is not None:
        rank = root_cause(output, result, size)
        output.note(f"hvdrun: {result.reason}{_others(result, size)}.")
        frozen = [r for r in result.frozen if r != result.failed]
        if frozen:  # its peers' waits on it timed out: the cause, though it printed nothing
            which = ", ".join(str(r) for r in frozen)
            output.note(f"hvdrun: rank{'s' if len(frozen) > 1 else ''} {which} "
                        f"{'were' if len(frozen) > 1 else 'was'} stopped (SIGSTOP/SIGTSTP, or "
                        f"held by a debugger or tracer) when rank {result.failed} failed.")
        if rank != result.failed:
            output.note(f"hvdrun: rank {result.failed} only lost its peer; the error came from "
                        f"rank {rank}.")
        lines = traceback_tail(output.tail(rank))
        if lines:
            output.note(f"hvdrun: rank {rank}'s last error output:")
            for line in lines:
                output.note(f"    {line}")
        else:  # a killed rank says nothing: what its peers said about it is the explanation
            for other in range(size):
                said = traceback_tail(output.tail(other)) if other != rank else []
                if said and said[0].startswith("Traceback"):
                    output.note(f"hvdrun: rank {other}'s error: {said[-1]}")
    elif result.interrupted:
        output.note(f"hvdrun: {result.reason}: stopped all ranks.")
    elif result.reason:
        output.note(f"hvdrun: {result.reason}.")


def _exit_code(result: JobResult) -> int:
    if result.failed is not None:
        return exit_status(result.codes.get(result.failed)) or 1
    if result.interrupted:
        return 143 if "SIGTERM" in result.reason else 130
    bad = [c for c in result.codes.values() if c != 0]
    return exit_status(bad[0]) if bad else 0


def _install_signals(job: ProcessJob) -> None:
    def on_signal(signum, frame):
        job.stop(f"hvdrun received {signal.Signals(signum).name}")
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            signal.signal(sig, on_signal)
        except ValueError:  # not the main thread
            pass


class _GpuPinner:
    """Pins the environment of each rank hvdrun starts on this machine (gpu_pinning.pin) from
    one GPU discovery for all of them, and says once when ranks share GPUs. Every slot runs on
    this machine, so ranks are placed by their order among all slots: several "hosts" naming
    this machine (-H localhost:2,127.0.0.1:2) do not pin two ranks to one GPU. No GPU visible
    (or --gpus none): nothing is done."""

    def __init__(self, env: dict, output: RankOutput, total: int):
        from engine_native import gpu

        hidden = env.get("CUDA_VISIBLE_DEVICES") == ""  # --gpus none: nothing to discover
        self.devices = [] if hidden else gpu.visible_devices(env)[0]
        self.output, self.total, self.placed = output, total, 0

    def __call__(self, rank_env: dict, slot) -> None:
        if not self.devices:
            return
        gpu_pinning.pin(self.placed, self.total, environ=rank_env, devices=self.devices,
                        sharing=lambda text: self.output.note(f"hvdrun: {text}"),
                        set_device_rank=slot.local_rank)
        gpu_pinning.child_env(rank_env)
        self.placed += 1


def run_local(args, command, slots, env, output) -> int:
    """Rendezvous flavour: every rank a child process of hvdrun; ranks sharing GPUs run under
    a private MPS daemon (hvd_magic.launch.mps; unless --no-mps) stopped after them, also
    when a rank failed or hvdrun was signalled."""
    size = len(slots)
    secret, job_id = secrets.token_bytes(32), uuid.uuid4().hex[:12]
    if args.dry_run:
        if args.mps != "off":
            from engine_native import gpu
            chosen = mpslib.plan(args.mps, size, len(gpu.visible_devices(env)[0]), env)
            if chosen.note:
                print(chosen.note)
        for slot in slots:
            print(f"rank {slot.rank} on {slot.host}: HVD_RANK={slot.rank} HVD_SIZE={size} "
                  f"{shlex.join(command)}")
        return 0
    pin_gpus = _GpuPinner(env, output, len(slots))
    daemon = _start_mps(args, env, output, size, len(pin_gpus.devices))
    if daemon is False:
        return 1
    try:
        return _run_ranks(args, command, slots, env, output, pin_gpus, secret, job_id)
    finally:
        if daemon is not None:
            daemon.stop()


def _start_mps(args, env, output, ranks: int, gpus: int):
    """The job's MPS daemon (its variables added to ``env``; Note [MPS by default]), None
    when none is started (said when GPUs are shared), False when ``--mps`` failed (said)."""
    try:
        daemon = mpslib.start_for_job(args.mps, ranks, gpus, env,
                                      lambda text: output.note(f"hvdrun: {text}"))
    except mpslib.MpsError as exc:
        output.note(f"hvdrun: {exc}")
        return False
    if daemon is not None:
        env.update(daemon.env)
    return daemon


def _run_ranks(args, command, slots, env, output, pin_gpus, secret, job_id) -> int:
    from engine_native.rendezvous import RendezvousServer

    size = len(slots)
    fake_hosts = len({s.host for s in slots}) > 1
    job = ProcessJob(output)
    _install_signals(job)
    with RendezvousServer(secret, host="127.0.0.1") as server:
        address = "%s:%d" % server.address
        if args.verbose:
            output.note(f"hvdrun: {size} rank(s) on "
                        f"{','.join(sorted({s.host for s in slots}))}, rendezvous {address}, "
                        f"job {job_id}: {shlex.join(command)}")
        for slot in slots:
            rank_env = config.rank_env(env, slot, size, rendezvous=address,
                                       secret_hex=secret.hex(), job_id=job_id,
                                       set_hostname=fake_hosts)
            config.share_threads(rank_env, size)  # every rank runs on this machine
            pin_gpus(rank_env, slot)
            try:
                job.add(slot.rank, spawn(command, rank_env))
            except OSError as exc:
                output.note(f"hvdrun: cannot start {command[0]!r} for rank {slot.rank}: {exc}")
                job.stop("start failed")
                job.run()
                return 127
        start = time.monotonic()
        result = job.run()
    if args.verbose:
        output.note(f"hvdrun: all ranks exited after {time.monotonic() - start:.2f} s")
    _report_failure(output, result, size)
    return _exit_code(result)


def run_mpi(args, command, slots, env, output) -> int:
    """mpiexec flavour: several hosts (or --mpi); ranks bootstrap through MPI."""
    exe = find_mpiexec() or ("mpiexec" if args.dry_run else None)
    if exe is None:
        output.note("hvdrun: the host list needs mpiexec, which was not found; install it with "
                    "`pip install mpich` (or a system MPI), or run on local hosts only")
        return 127
    if hostlib.only_loopback(host_list(args)):
        env["HVD_IFACE_ADDRESS"] = "127.0.0.1"  # "hosts" that are all this machine
    rank_cmd = [sys.executable, "-m", "hvd_magic.launch.rankwrap", "--", *command]
    flavor = mpi_flavor(exe) if os.path.isabs(exe) else "mpich"
    cmd = build_command(exe, flavor, slots, rank_cmd, env, ssh_port=args.ssh_port,
                        ssh_identity=args.ssh_identity_file, mpi_args=args.mpi_args,
                        user_names=frozenset(config.parse_env_pairs(args.env)))
    if args.dry_run or args.verbose:
        (print if args.dry_run else output.note)(shlex.join(cmd))
        if args.dry_run:
            return 0
    job = MpiJob(output)
    _install_signals(job)
    job.add(MpiJob.KEY, spawn(cmd, env))
    result = job.run()
    _report_failure(output, result, len(slots))
    return _exit_code(result)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from importlib.metadata import PackageNotFoundError, version
        try:
            print(f"hvdrun (hvd-magic) {version('hvd-magic')}")
        except PackageNotFoundError:
            print("hvdrun (hvd-magic, not installed)")
        return 0
    if args.check_build:
        print(check_build())
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command each rank runs, e.g. hvdrun -np 2 python train.py")
    try:
        elastic_driver.check_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    if args.min_np is not None:
        if args.mps == "on":
            parser.error("--mps is not supported with elastic runs (--min-np); drop one")
        return _main_elastic(args, command)
    try:
        hosts = host_list(args)
        np_ = args.np if args.np is not None else sum(h.slots for h in hosts or ()) or None
        if np_ is None:
            parser.error("-np N is required (or a host list whose slots give N)")
        slots = hostlib.assign(np_, hosts)
        env = env_from_args(args)
    except (ValueError, OSError) as exc:
        parser.error(str(exc))
    if args.gloo and args.mpi:
        parser.error("--gloo and --mpi exclude each other")
    if args.mps == "on" and (args.mpi or not hostlib.local_hosts(hosts)):
        parser.error("--mps starts the MPS daemon on this machine only, for ranks that hvdrun "
                     "starts here; through mpiexec (--mpi, or hosts other than this one) start "
                     "`nvidia-cuda-mps-control -d` on each host yourself, or drop --mps")
    output = RankOutput(output_dir=args.output_filename,
                        timestamp=args.prefix_output_with_timestamp)
    try:
        if args.mpi or (not args.gloo and not hostlib.local_hosts(hosts)):
            return run_mpi(args, command, slots, env, output)
        if not hostlib.local_hosts(hosts):
            output.note("hvdrun: --gloo runs ranks on this machine only; the host list names "
                        "other machines: drop --gloo to go through mpiexec")
            return 2
        return run_local(args, command, slots, env, output)
    except KeyboardInterrupt:
        output.note("hvdrun: interrupted (Ctrl-C): stopped all ranks.")
        return 130
    finally:
        output.close()


def _main_elastic(args, command) -> int:
    output = RankOutput(output_dir=args.output_filename,
                        timestamp=args.prefix_output_with_timestamp)
    try:
        env = env_from_args(args)
        env["HVD_ELASTIC_TIMEOUT"] = str(args.elastic_timeout)
        return elastic_driver.run_elastic(args, command, env, output, _install_signals)
    except KeyboardInterrupt:
        output.note("hvdrun: interrupted (Ctrl-C): stopped all workers.")
        return 130
    finally:
        output.close()


def console_main() -> None:
    """Entry point of the ``hvdrun`` console script."""
    sys.exit(main())


if __name__ == "__main__":
    console_main()
