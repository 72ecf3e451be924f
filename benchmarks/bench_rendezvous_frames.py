"""What sealing the rendezvous store's frames costs (issue #35 item 1).

Times N ``set`` + ``get`` round trips through a real RendezvousServer and RendezvousClient on
loopback, once with sealed frames (engine_native.sealed_frames, what ships) and once with the
same store over plain ``op | length | body`` frames (the protocol before sealing, kept here as
the baseline: the same server and client code with the channel swapped for one without the
tag). The server runs in its own process, as the launcher's does (in one process the two ends
would contend for the GIL and measure that instead). Reports wall time per round trip and the
CPU time both processes spent on it (the steadier number on a shared machine); best of
``--repeat`` runs.

    python benchmarks/bench_rendezvous_frames.py [--n 2000] [--repeat 3]
"""
from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine_native import rendezvous, rendezvous_client  # noqa: E402
from engine_native.sealed_frames import HEADER, SealedChannel, recv_exact  # noqa: E402


class PlainChannel(SealedChannel):
    """The baseline: the same frames without the tag and without checking anything."""

    def send(self, op: int, body: bytes) -> None:
        self.sock.sendall(HEADER.pack(op, len(body)) + body)

    def recv(self, max_body: int) -> tuple[int, bytes]:
        op, length = HEADER.unpack(recv_exact(self.sock, HEADER.size))
        if length > max_body:
            raise ValueError(f"frame of {length} bytes exceeds the limit of {max_body}")
        return op, recv_exact(self.sock, length)


@contextlib.contextmanager
def channel(cls: type) -> None:
    saved = rendezvous.SealedChannel, rendezvous_client.SealedChannel
    rendezvous.SealedChannel = rendezvous_client.SealedChannel = cls
    try:
        yield
    finally:
        rendezvous.SealedChannel, rendezvous_client.SealedChannel = saved


def serve(cls: type, pipe) -> None:
    """The server's process: the store over ``cls`` frames until told to stop."""
    with channel(cls), rendezvous.RendezvousServer(b"bench-secret") as server:
        pipe.send(server.address)
        while pipe.recv() == "cpu?":
            pipe.send(time.process_time())


def round_trips(cls: type, value: bytes, n: int) -> tuple[float, float]:
    """Wall and CPU (client + server) seconds per set + get pair (two frames each way)."""
    here, there = multiprocessing.get_context("spawn").Pipe()
    proc = multiprocessing.get_context("spawn").Process(target=serve, args=(cls, there))
    proc.start()
    try:
        address = "%s:%d" % here.recv()
        with channel(cls), rendezvous.RendezvousClient(address, b"bench-secret") as client:
            client.set("warm", b"x")
            here.send("cpu?")
            server_cpu = here.recv()
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(n):
                client.set("k", value)
                if client.get("k", timeout=5) != value:
                    raise AssertionError("wrong value")
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            here.send("cpu?")
            cpu += here.recv() - server_cpu
            return wall / n, cpu / n
    finally:
        here.send("stop")
        proc.join(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="round trips per small value")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print("| value | round trips | plain: wall / CPU (us) | sealed: wall / CPU (us) "
          "| cost: wall / CPU |")
    print("|---|---|---|---|---|")
    for size, n in ((64, args.n), (4096, args.n), (1 << 20, max(20, args.n // 20))):
        value = os.urandom(size)
        plain = [min(t) for t in zip(*(round_trips(PlainChannel, value, n)
                                       for _ in range(args.repeat)))]
        sealed = [min(t) for t in zip(*(round_trips(SealedChannel, value, n)
                                        for _ in range(args.repeat)))]
        label = f"{size} B" if size < 1024 else f"{size // 1024} KiB"
        cost = " / ".join(f"{(s - p) * 1e6:+.1f} us ({(s / p - 1) * 100:+.0f}%)"
                          for p, s in zip(plain, sealed))
        print(f"| {label} | {n} | {plain[0] * 1e6:.1f} / {plain[1] * 1e6:.1f} "
              f"| {sealed[0] * 1e6:.1f} / {sealed[1] * 1e6:.1f} | {cost} |")


if __name__ == "__main__":
    main()
