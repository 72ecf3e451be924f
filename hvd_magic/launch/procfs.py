"""Processes as /proc shows them, for the MPS daemon's bookkeeping and the launcher's check for
stopped ranks (Linux only; no psutil on a bare GPU machine): every pid, a process's command line, environment and state,
its descendants, and a wait until a set of processes is gone. A process that is gone, or
another user's, reads as empty.
"""
from __future__ import annotations

import os
import time

__all__ = ["pids", "read", "cmdline", "environ", "stat", "alive", "descendants", "wait_gone"]


def pids() -> list[int]:
    return [int(e) for e in os.listdir("/proc") if e.isdigit()]


def read(pid: int, name: str) -> bytes:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as fh:
            return fh.read()
    except OSError:  # gone, or another user's
        return b""


def cmdline(pid: int) -> list[str]:
    return [a.decode(errors="replace") for a in read(pid, "cmdline").split(b"\0") if a]


def environ(pid: int) -> dict:
    pairs = (a.decode(errors="replace").partition("=") for a in read(pid, "environ").split(b"\0"))
    return {k: v for k, _, v in pairs if k}


def stat(pid: int) -> list[str]:
    """state, ppid, ... (the fields after the command name); [] when gone."""
    text = read(pid, "stat").decode(errors="replace")
    return text.rsplit(")", 1)[1].split() if ")" in text else []


def alive(pid: int) -> bool:
    fields = stat(pid)
    return bool(fields) and fields[0] != "Z"


def descendants(pid: int) -> set:
    parent = {}
    for p in pids():
        fields = stat(p)
        if len(fields) > 1:
            parent[p] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - found
        found |= frontier
    return found


def wait_gone(pids, timeout: float, poll: float) -> set:
    """Wait (polling, ``poll`` s apart) until ``pids`` exited; returns those still alive."""
    deadline = time.monotonic() + timeout
    left = {p for p in pids if alive(p)}
    while left and time.monotonic() < deadline:
        time.sleep(poll)
        left = {p for p in left if alive(p)}
    return left
