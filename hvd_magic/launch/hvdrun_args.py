"""``hvdrun``'s command line: horovodrun's flags (:func:`build_parser`) and what they become,
the ranks' environment (:func:`env_from_args`) and the host list (:func:`host_list`).
"""

from __future__ import annotations

import argparse

from ..gpu_pinning import GPUS_CHOICES
from . import config
from . import hosts as hostlib

__all__ = ["build_parser", "env_from_args", "host_list"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hvdrun", allow_abbrev=False,  # a command's --timeline is not our --timeline-...
        description="Run a command as N Horovod-style ranks (horovodrun's flags).",
        epilog="example: hvdrun -np 4 python train.py --epochs 2")
    p.add_argument("-v", "--version", action="store_true", help="print the version and exit")
    p.add_argument("-np", "--num-proc", dest="np", type=int, help="number of ranks")
    p.add_argument("-cb", "--check-build", action="store_true",
                   help="show which frameworks, controllers and transports are available")
    p.add_argument("-H", "--hosts", help="host1:slots,host2:slots (default: localhost:np)")
    p.add_argument("-hostfile", "--hostfile", help="file with 'host slots=N' lines")
    p.add_argument("--gloo", action="store_true",
                   help="start ranks with hvdrun's rendezvous (default for local hosts)")
    p.add_argument("--mpi", action="store_true", help="start ranks through mpiexec")
    p.add_argument("--mpi-args", help="extra arguments for mpiexec")
    p.add_argument("-p", "--ssh-port", type=int, help="ssh port of the remote hosts")
    p.add_argument("-i", "--ssh-identity-file", help="ssh identity (key) file")
    p.add_argument("--start-timeout", type=float,
                   help="seconds for all ranks to start and find each other (default 60)")
    p.add_argument("--gpus", choices=GPUS_CHOICES, default="auto",
                   help="auto: one GPU per local rank (CUDA_VISIBLE_DEVICES narrowed to it; "
                        "torch.cuda.set_device(hvd.local_rank()) still works); none: hide the "
                        "GPUs, CPU only (not a horovodrun flag)")
    p.add_argument("--mps", dest="mps", action="store_const", const="on", default="auto",
                   help="the default when the ranks outnumber this machine's GPUs: run them "
                        "under a private NVIDIA MPS daemon started for this job and stopped "
                        "after it (one shared GPU context instead of time-slicing); --mps makes "
                        "a daemon that cannot start an error (not a horovodrun flag)")
    p.add_argument("--no-mps", dest="mps", action="store_const", const="off",
                   help="never start an MPS daemon (ranks sharing a GPU are time-sliced)")
    p.add_argument("--env", action="append", metavar="KEY=VALUE", default=[],
                   help="extra environment variable for every rank (repeatable)")
    p.add_argument("--output-filename", metavar="DIR",
                   help="also write each rank's output to DIR/rank.<r>/stdout|stderr")
    p.add_argument("--prefix-output-with-timestamp", action="store_true")
    p.add_argument("--verbose", action="store_true", help="say what hvdrun does")
    p.add_argument("--dry-run", action="store_true",
                   help="print the commands that would run, run nothing")
    e = p.add_argument_group("elastic (Horovod's meaning; see hvd_magic.launch.elastic_driver)")
    e.add_argument("--min-np", type=int, help="fewest workers the job runs with")
    e.add_argument("--max-np", type=int, help="most workers (default: every discovered slot)")
    e.add_argument("--host-discovery-script",
                   help="executable printing the current hosts, one host[:slots] per line")
    e.add_argument("--slots-per-host", type=int, help="slots of a host printed without :slots")
    e.add_argument("--elastic-timeout", type=float, default=600.0,
                   help="seconds to wait for --min-np slots at start (default 600)")
    e.add_argument("--reset-limit", type=int,
                   help="fail the job after this many re-formings (default: no limit)")
    e.add_argument("--blacklist-cooldown-range", type=int, nargs=2, metavar=("MIN", "MAX"),
                   help="a blacklisted host is used again after MIN*2^k + U(0,1)*MIN seconds "
                   "(its k-th blacklisting), at most MAX (default: never)")
    t = p.add_argument_group("tunables (become HVD_* variables)")
    t.add_argument("--fusion-threshold-mb", type=float)
    t.add_argument("--cycle-time-ms", type=float)
    t.add_argument("--cache-capacity", type=int)
    t.add_argument("--disable-cache", action="store_true", help="same as --cache-capacity 0")
    t.add_argument("--hierarchical-allreduce", dest="hierarchical_allreduce",
                   action="store_true", default=None)
    t.add_argument("--no-hierarchical-allreduce", dest="hierarchical_allreduce",
                   action="store_false")
    t.add_argument("--tcp", action="store_true", help="TCP between all ranks (no shm)")
    t.add_argument("--bind-to", choices=("none", "auto", "core"), default=None,
                   help="core: each rank of a host on its own share of the host's CPUs (one "
                        "CPU shared evenly where the ranks outnumber them; HVD_CPU_BIND); "
                        "auto (the core's default): only where the ranks outnumber them by a "
                        "whole multiple; none: never, as horovodrun")
    t.add_argument("--timeline-filename", help="write a Chrome-trace timeline (rank 0)")
    t.add_argument("--timeline-mark-cycles", action="store_true")
    t.add_argument("--autotune", action="store_true", help="tune fusion and cycle time")
    t.add_argument("--autotune-log-file")
    t.add_argument("--no-stall-check", action="store_true")
    t.add_argument("--stall-check-warning-time-seconds", type=float)
    t.add_argument("--stall-check-shutdown-time-seconds", type=float,
                   help="fail ops that can never complete (ranks submitted different ops) "
                        "after this many seconds (default 0: never, as Horovod)")
    t.add_argument("--log-level", help="TRACE, DEBUG, INFO, WARNING, ERROR or FATAL")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command each rank runs")
    return p


def env_from_args(args) -> dict:
    env = config.clean_env()
    env.update(config.tunables_env(
        fusion_threshold_mb=args.fusion_threshold_mb, cycle_time_ms=args.cycle_time_ms,
        cache_capacity=0 if args.disable_cache else args.cache_capacity,
        hierarchical_allreduce=args.hierarchical_allreduce,
        timeline_filename=args.timeline_filename, timeline_mark_cycles=args.timeline_mark_cycles,
        autotune=args.autotune, autotune_log_file=args.autotune_log_file,
        log_level=args.log_level, no_stall_check=args.no_stall_check,
        stall_check_warning_time_seconds=args.stall_check_warning_time_seconds,
        stall_check_shutdown_time_seconds=args.stall_check_shutdown_time_seconds, tcp=args.tcp,
        start_timeout=args.start_timeout, bind_to=args.bind_to))
    env.update(config.parse_env_pairs(args.env))
    if args.gpus == "none":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def host_list(args) -> list | None:
    if args.hosts and args.hostfile:
        raise ValueError("give either -H or -hostfile, not both")
    if args.hostfile:
        return hostlib.read_hostfile(args.hostfile)
    return hostlib.parse_hosts(args.hosts) if args.hosts else None
