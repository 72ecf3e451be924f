"""Small ops with and without the one-round board (Note [One round] in
engine_native/csrc/runtime/one_round.cc), against MPICH, in one run: rounds of three launches,
ours (default), ours with HVD_ONE_ROUND_BYTES=0 (negotiated through rank 0, as before the board)
and MPICH, in alternating order, so the load of a shared machine drifts over all three alike;
each figure is the median over the rounds of each launch's median time per op (the slowest
rank's, per iteration).

    python benchmarks/bench_one_round.py --np 2,4 --rounds 5 [--sizes 4,4096] [--tcp | --hosts N]
                                         [--bind]

Every row takes the board (blocking, up to HVD_ONE_ROUND_BYTES: metrics' one_round_ops counts
allreduce, broadcast, allgather, alltoall and reducescatter alike), so no row is a control:
the spread of each round's figures shows the noise. Since the board spans hosts (20a03ea) it
is on with --tcp and --hosts too; before, both of ours were negotiated there. With --after-join
every rank calls join() once before the timed ops (MPICH: a barrier), so the table shows the
ops of a training loop after an epoch's join (Note [One round] J: the board opens again).
With --hosts N the ranks spread over N fake hosts in blocks (np 4 over 2: ranks 0-1 and 2-3),
the across-hosts case on one machine: ours through HVD_HOSTNAME per rank (shm within a host,
TCP between hosts, no HVD_TRANSPORT), MPICH through MPIR_CVAR_NUM_CLIQUES=N with
MPIR_CVAR_CLIQUES_BY_BLOCK=1 and UCX held to TCP (launcher.mpich_hosts_env: shared memory
within a clique, TCP between cliques).
The row "broadcast root answered" sets ours' broadcast against MPICH's Bcast followed by a 4 B
Reduce to the root: a root that raises when another rank's broadcast does not match (Horovod's
guarantee, kept by the board: Note [One round] B) must hear from every rank each op, which
MPI's Bcast alone never does (its root writes and returns, so in a loop the readers' copies
overlap its next write).
Nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import benchlib  # noqa: E402
from benchlib import fmt_time, median  # noqa: E402
from launcher import Context, mpich_hosts_env  # noqa: E402

SIZES = [4, 4096]
VARIANTS = {"ours": ("ours", None), "ours, one round off": ("ours", {"HVD_ONE_ROUND_BYTES": "0"}),
            "MPICH": ("mpi", None)}
# (case, op, variant, MPICH's op where it differs)
ROWS = [("allreduce", "allreduce", "out-of-place", None),
        ("allreduce", "allreduce", "in-place", "out-of-place"),  # MPICH's in-place is noisier
        ("collectives", "broadcast", None, None),
        ("collectives", "broadcast", "root answered", "broadcast_answered"),
        ("collectives", "allgather", None, None), ("collectives", "alltoall", None, None),
        ("collectives", "reducescatter", None, None)]


def _spec(case: str) -> dict:
    if case == "allreduce":
        return {"sizes": SIZES, "target_bytes": 1 << 20, "min_iters": 200, "max_iters": 2000,
                "warmup": 2, "budget_s": 0.5}
    return {"sizes": SIZES, "target_bytes": 1 << 20, "max_iters": 400, "budget_s": 0.5,
            "answered": True}


def _figures(results: list) -> dict:
    """key ('op|bytes' or 'variant|bytes') -> the slowest rank's median time per op."""
    common = set.intersection(*[set(r["times"]) for r in results])
    return {key: median(benchlib.per_iteration_max([r["times"][key] for r in results]))
            for key in common}


def _hosts_text(np_ranks: int, hosts: int) -> str:
    env = " ".join(f"{k}={v}" for k, v in mpich_hosts_env(hosts).items())
    return (f"{hosts} hosts of {np_ranks // hosts} (ours: HVD_HOSTNAME per rank; MPICH: "
            f"{env})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--np", default="2,4")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", default="4,4096", help="bytes per rank, comma list")
    parser.add_argument("--tcp", action="store_true",
                        help="forced TCP, a host per rank (ours-tcp, mpi-tcp)")
    parser.add_argument("--hosts", type=int, default=0,
                        help="ranks over this many fake hosts in blocks (must divide each np)")
    parser.add_argument("--after-join", action="store_true",
                        help="every rank joins once before the timed ops")
    parser.add_argument("--bind", action="store_true",
                        help="ours with HVD_CPU_BIND=core, MPICH with -bind-to core (a rank "
                             "alone on its host, as under --tcp, stays unbound); without it "
                             "ours runs its default, auto (np=4 on 2 CPUs bound)")
    args = parser.parse_args()
    if args.tcp:
        for label, (system, env) in list(VARIANTS.items()):
            VARIANTS[label] = (system + "-tcp", env)
    SIZES[:] = [int(s) for s in args.sizes.split(",")]
    nps = [int(n) for n in args.np.split(",")]
    if args.hosts and (args.tcp or args.hosts < 2 or any(n % args.hosts for n in nps)):
        parser.error("--hosts N: N >= 2 dividing every --np, and not with --tcp")
    ctx = Context(nps, quick=False, horovod=(False, ""))
    ctx.bind = args.bind
    print(f"load average at start: {benchlib.load_average()}")
    for np_ranks in nps:
        got: dict = {}  # (label, case, key) -> [per-round medians]
        for rnd in range(args.rounds):
            for label in benchlib.alternate(list(VARIANTS), rnd):
                system, env = VARIANTS[label]
                for case in ("allreduce", "collectives"):
                    spec = dict(_spec(case), join_first=args.after_join)
                    results = ctx.run(system, np_ranks, case, spec, env=env, hosts=args.hosts,
                                      label=f"{case}/{label}/np{np_ranks}/round{rnd + 1}")
                    for key, t in (_figures(results) if results else {}).items():
                        got.setdefault((label, case, key), []).append(t)
        where = ("forced TCP" if args.tcp else _hosts_text(np_ranks, args.hosts)
                 if args.hosts else "shm") + (", after a join" if args.after_join else "") + \
            (", bound (ours HVD_CPU_BIND=core, MPICH -bind-to core)" if args.bind else "")
        print(f"\n### small ops, np={np_ranks}, {where}: median over {args.rounds} rounds of the median "
              "time per op (each round's figures in brackets)\n")
        print("| op | size | " + " | ".join(VARIANTS) + " | on / off | ours / MPICH |")
        print("|---|---|" + "---|" * (len(VARIANTS) + 2))
        for case, op, variant, peer_op in ROWS:
            for nbytes in SIZES:
                cells, med = [], {}
                for label in VARIANTS:
                    ours_key = variant if case == "allreduce" else op
                    key = f"{(peer_op if label == 'MPICH' else None) or ours_key}|{nbytes}"
                    runs = got.get((label, case, key), [])
                    med[label] = median(runs) if runs else None
                    cells.append(f"{fmt_time(med[label])} [" +
                                 ", ".join(fmt_time(t) for t in runs) + "]" if runs else "-")
                on, off, peer = med["ours"], med["ours, one round off"], med["MPICH"]
                ratio = f"{on / off:.2f}x" if on and off else "-"
                vs_peer = f"{on / peer:.2f}x" if on and peer else "-"
                name = op + (" " + variant if variant else "")
                print(f"| {name} | {nbytes} B | " + " | ".join(cells) + f" | {ratio} | {vs_peer} |")
    print(f"\nload average at end: {benchlib.load_average()}")
    for note in ctx.notes:
        print("- " + note)


if __name__ == "__main__":
    main()
