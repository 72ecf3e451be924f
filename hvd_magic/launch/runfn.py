"""``hvd_magic.run(fn, np=N)``: Horovod's ``horovod.run`` on this project's core.

>>> def train(lr):
...     import engine_native.torch as hvd
...     hvd.init()
...     return hvd.rank() * lr
>>> hvd_magic.run(train, args=(0.1,), np=2)
[0.0, 0.1]

``fn`` travels by cloudpickle, so closures and functions defined in a notebook work. Ranks are
child processes of the caller (or mpiexec's, for other hosts); their output is streamed to the
caller with ``[rank]<stdout>:`` prefixes. Returns the list of return values indexed by rank;
an exception on any rank stops the others and raises :class:`RankFailedError` here, with the
rank and its remote traceback.
"""

from __future__ import annotations

import secrets
import sys
import uuid
from collections.abc import Callable
from typing import Any

from ..gpu_pinning import check_choice
from . import config
from . import hosts as hostlib
from . import mps as mpslib
from .output import RankOutput, traceback_tail
from .pickling import dumps_call, loads
from .procs import JobResult, ProcessJob, describe_exit, spawn

__all__ = ["RankFailedError", "run"]

STORE_MAX_VALUE = (1 << 32) - (1 << 17)  # the store's frames carry a 32-bit length
STORE_MAX_TOTAL = 1 << 36
_INTERNAL = ("HorovodInternalError",)


class RankFailedError(RuntimeError):
    """A rank of :func:`run` failed. ``rank``: which one; ``exception``: its exception when it
    could be sent back; ``remote_traceback``: its traceback as text; ``failures``: a one-line
    summary per failed rank."""

    def __init__(self, message: str, rank: int, exception: BaseException | None = None,
                 remote_traceback: str = "", failures: dict | None = None):
        super().__init__(message)
        self.rank = rank
        self.exception = exception
        self.remote_traceback = remote_traceback
        self.failures = failures or {}


def _fn_name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def _num_proc(np: int | None, num_proc: int | None) -> int:
    if np is not None and num_proc is not None and np != num_proc:
        raise ValueError(f"run(): np={np} and num_proc={num_proc} disagree; give one of them")
    n = np if np is not None else num_proc if num_proc is not None else 1
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"run(): the number of processes must be an int >= 1, got {n!r}")
    return n


def _store(server, secret: bytes):
    from engine_native.rendezvous import RendezvousClient
    return RendezvousClient("%s:%d" % server.address, secret)


def collect_results(client, key: str, size: int) -> dict:
    """rank -> decoded result dict, for the ranks that stored one."""
    found = {}
    for rank in range(size):
        try:
            found[rank] = loads(client.get(f"{key}/result/{rank}", timeout=0.0))
        except TimeoutError:
            pass
        except Exception as exc:  # a result that does not unpickle here
            found[rank] = {"ok": False, "stage": "result", "type": type(exc).__name__,
                           "message": f"its result could not be loaded here: {exc}",
                           "traceback": "", "exception": None}
    return found


def _summary(rank: int, res: dict | None, code: int | None) -> str:
    if res is None:
        return f"rank {rank} {describe_exit(code)} before returning a result"
    return f"rank {rank} raised {res['type']}: {res['message']}".rstrip()


def failure_error(job: JobResult, results: dict, size: int, output: RankOutput,
                  what: str) -> RankFailedError | None:
    """The error to raise for a job in which a rank failed (None when every rank returned)."""
    failed = {r: res for r, res in results.items() if not res["ok"]}
    missing = [r for r in range(size) if r not in results]
    if not failed and not missing and job.failed is None:
        return None
    candidates = sorted(set(failed) | set(missing))
    primary = job.failed if job.failed in candidates else (candidates[0] if candidates else 0)
    if primary in failed and failed[primary]["type"] in _INTERNAL:
        # A rank that lost its peer reports HorovodInternalError; the peer's own error is the cause.
        own = [r for r in failed if failed[r]["type"] not in _INTERNAL]
        primary = own[0] if own else primary
    res = failed.get(primary)
    summaries = {r: _summary(r, failed.get(r), job.codes.get(r)) for r in candidates}
    head = f"{what}: {summaries[primary]}"
    # Other ranks' own errors are worth showing; lost peers and ranks we stopped are not.
    own = [summaries[r] for r in candidates if r != primary and r in failed
           and failed[r]["type"] not in _INTERNAL]
    if own:
        head += "\n  also: " + "\n  also: ".join(own)
    if len(candidates) > 1 + len(own):
        head += "\n  (the other ranks lost their peer or were stopped)"
    if res is not None and res.get("stage") == "load":
        head += ("\n  fix: functions from modules travel by reference; make the module "
                 "importable by the ranks (install it or put it on PYTHONPATH), or call "
                 "cloudpickle.register_pickle_by_value(module) before run()")
    exception, remote_tb = None, ""
    if res is not None:
        remote_tb = res.get("traceback", "")
        if res.get("exception"):
            try:
                exception = loads(res["exception"])
            except Exception:
                exception = None
    else:
        remote_tb = "\n".join(traceback_tail(output.tail(primary)))
    if remote_tb:
        head += f"\n\nRemote traceback (rank {primary}):\n{remote_tb.rstrip()}"
    return RankFailedError(head, primary, exception, remote_tb, summaries)


def run(fn: Callable, args=(), kwargs: dict | None = None, num_proc: int | None = None,
        min_num_proc=None, max_num_proc=None, slots=None, reset_limit=None,
        cooldown_range=None, hosts: str | None = None, hostfile: str | None = None,
        host_discovery_script=None, start_timeout: float | None = None,
        ssh_port: int | None = None, ssh_identity_file: str | None = None,
        disable_cache: bool | None = None, output_filename: str | None = None,
        verbose: int | None = None, use_gloo: bool | None = None,
        use_mpi: bool | None = None, mpi_args: str | None = None,
        network_interfaces=None, executable: str | None = None,
        env: dict | None = None, np: int | None = None, *,
        stdout=None, stderr=None, prefix_output_with_timestamp: bool = False,
        only_ranks=None, what: str | None = None, gpus: str = "auto",
        mps="auto") -> list:
    """Run ``fn(*args, **kwargs)`` on ``np`` ranks; return the results indexed by rank.

    Parameters follow ``horovod.run``: ``np``/``num_proc`` (ranks), ``hosts``
    ("host:slots,..."), ``hostfile``, ``env`` (added to this process's environment),
    ``start_timeout`` (seconds for ranks to start and meet, default 60), ``use_mpi`` (start
    through mpiexec; automatic for non-local hosts), ``use_gloo`` (rendezvous start, the
    local default), ``mpi_args``, ``ssh_port``, ``ssh_identity_file``, ``output_filename``,
    ``executable`` (Python of the ranks), ``verbose``. Elastic arguments are not supported.
    Beyond Horovod: ``stdout``/``stderr`` (streams for rank output), ``only_ranks`` (show
    only these ranks' output), ``gpus``: "auto" pins one GPU per local rank in each rank
    before ``fn`` runs (``cuda:0`` is the rank's GPU and ``torch.cuda.set_device(
    hvd.local_rank())`` still works; hvd_magic.gpu_pinning), "none" hides the GPUs;
    ``mps``: "auto" (default): when the ranks outnumber this machine's GPUs, run them under
    a private MPS daemon started for this call and stopped after it, or say why not
    (hvd_magic.launch.mps, Note [MPS by default]; local ranks only); True: the same, and an
    error when it cannot start; False: never.

    Raises
    ------
    RankFailedError
        A rank raised or died; names the rank and shows its remote traceback.
    UnpicklableError
        ``fn``, ``args`` or ``kwargs`` cannot be pickled; names the object and the fix.
    """
    _refuse_elastic(min_num_proc=min_num_proc, max_num_proc=max_num_proc, slots=slots,
                    reset_limit=reset_limit, cooldown_range=cooldown_range,
                    host_discovery_script=host_discovery_script)
    if network_interfaces is not None and verbose:
        print("run(): network_interfaces is ignored; set HVD_IFACE_ADDRESS in env instead",
              file=sys.stderr)
    if use_gloo and use_mpi:
        raise ValueError("run(): use_gloo and use_mpi exclude each other")
    what = what or f"run({_fn_name(fn)})"
    check_choice(gpus, what)
    mps = mpslib.mode_of(mps, f"{what}: mps")
    size = _num_proc(np, num_proc)
    payload = dumps_call(fn, tuple(args), dict(kwargs or {}), what)
    host_list = (hostlib.read_hostfile(hostfile) if hostfile
                 else hostlib.parse_hosts(hosts) if hosts else None)
    slot_list = hostlib.assign(size, host_list)
    mpi = bool(use_mpi) or not hostlib.local_hosts(host_list)
    base = config.with_caller_path(config.clean_env())
    base.update(config.tunables_env(start_timeout=start_timeout,
                                    cache_capacity=0 if disable_cache else None))
    base.update({k: str(v) for k, v in (env or {}).items()})
    if gpus == "none":
        base["CUDA_VISIBLE_DEVICES"] = ""  # each rank pins itself (launch/task.py): to nothing
    output = RankOutput(stdout, stderr, output_dir=output_filename,
                        timestamp=prefix_output_with_timestamp, only_ranks=only_ranks)
    launch = _Launch(slot_list, base, output, what, executable, bool(verbose), mpi,
                     mpi and not hostlib.only_loopback(host_list),
                     dict(mpi_args=mpi_args, ssh_port=ssh_port, ssh_identity=ssh_identity_file,
                          user_names=frozenset(env or {})))
    daemon = _start_mps(mps, mpi, size, base, output, what)
    try:
        result, results = launch.run(payload)
    finally:
        if daemon is not None:
            daemon.stop()
        output.close()
    error = failure_error(result, results, size, output, what)
    if error is not None:
        raise error
    return [results[r]["value"] for r in range(size)]


def _start_mps(mps: str, mpi: bool, size: int, base: dict, output, what: str):
    """The call's MPS daemon (Note [MPS by default]), its variables added to ``base``; None
    when none is started (said when GPUs are shared). Raises MpsError when mps=True and it
    cannot start."""
    if mps == "off" or (mpi and mps == "auto"):
        return None
    if mpi:
        output.close()
        raise ValueError(f"{what}: mps=True starts the MPS daemon on this machine only; with "
                         f"mpiexec (use_mpi, or other hosts) start `nvidia-cuda-mps-control -d` "
                         f"on each host yourself, or drop mps=True")
    try:
        daemon = mpslib.start_for_job(mps, size, mpslib.gpu_count(base), base,
                                      lambda text: output.note(f"{what}: {text}"))
    except BaseException:
        output.close()
        raise
    if daemon is not None:
        base.update(daemon.env)
    return daemon


def _refuse_elastic(**given) -> None:
    named = [k for k, v in given.items() if v is not None]
    if named:
        raise ValueError(f"run(): elastic arguments ({', '.join(named)}) are not supported; "
                         "run a fixed number of ranks with np=N")


class _Launch:
    """One run(): the store that holds the payload and the results, and the ranks."""

    def __init__(self, slots, base, output, what, executable, verbose, mpi, remote, mpi_opts):
        self.slots, self.base, self.output, self.what = slots, base, output, what
        self.rank_cmd = [executable or sys.executable, "-m", "hvd_magic.launch.task"]
        self.verbose, self.mpi, self.remote, self.mpi_opts = verbose, mpi, remote, mpi_opts

    def run(self, payload: bytes):
        from engine_native.rendezvous import RendezvousServer

        secret, key = secrets.token_bytes(32), "run-" + uuid.uuid4().hex[:12]
        advertised = (hostlib.address_toward([s.host for s in self.slots]) if self.remote
                      else "127.0.0.1")
        server = RendezvousServer(secret, host=advertised,  # the one interface ranks use
                                  max_value_bytes=STORE_MAX_VALUE,
                                  max_total_bytes=STORE_MAX_TOTAL)
        server.start()
        try:
            address = f"{advertised}:{server.address[1]}"
            with _store(server, secret) as client:
                client.set(f"{key}/payload", payload)
                self.base.update(HVD_RUN_STORE=address, HVD_RUN_KEY=key,
                                 HVD_SECRET=secret.hex())
                if self.verbose:
                    self.output.note(f"{self.what}: {len(self.slots)} rank(s), store {address}, "
                                     f"{'mpiexec' if self.mpi else 'local processes'}")
                if self.mpi:
                    result = _run_mpi(self.slots, self.rank_cmd, self.base, self.output,
                                      not self.remote, **self.mpi_opts)
                else:
                    result = _run_local(self.slots, self.rank_cmd, self.base, self.output,
                                        address, secret, key)
                return result, collect_results(client, key, len(self.slots))
        finally:
            server.stop()


def _run_local(slot_list, rank_cmd, base, output, address, secret, key) -> JobResult:
    job = ProcessJob(output)
    fake_hosts = len({s.host for s in slot_list}) > 1
    for slot in slot_list:
        env = config.rank_env(base, slot, len(slot_list), rendezvous=address,
                              secret_hex=secret.hex(), job_id=key, set_hostname=fake_hosts)
        config.share_threads(env, len(slot_list))  # every rank runs on this machine
        try:
            job.add(slot.rank, spawn(rank_cmd, env))
        except OSError:
            job.stop("start failed")
            job.run()
            raise
    return job.run()


def _run_mpi(slot_list, rank_cmd, base, output, loopback, mpi_args, ssh_port,
             ssh_identity, user_names) -> JobResult:
    from .mpi import MpiJob, build_command, find_mpiexec, mpi_flavor

    exe = find_mpiexec()
    if exe is None:
        raise RuntimeError("run(): use_mpi / other hosts need mpiexec, which was not found; "
                           "install it with `pip install mpich` or a system MPI")
    if loopback:
        base["HVD_IFACE_ADDRESS"] = "127.0.0.1"
    wrapped = [sys.executable, "-m", "hvd_magic.launch.rankwrap", "--", *rank_cmd]
    cmd = build_command(exe, mpi_flavor(exe), slot_list, wrapped, base, ssh_port=ssh_port,
                        ssh_identity=ssh_identity, mpi_args=mpi_args, user_names=user_names)
    job = MpiJob(output)
    job.add(MpiJob.KEY, spawn(cmd, base))
    return job.run()
