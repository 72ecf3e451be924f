"""Random and mutated inputs for the Python decoders of peer bytes (:mod:`py_targets`): the
same strategy and table as the C++ driver (tests/fuzz/driver/main.cc).

    python tests/fuzz/py_fuzz.py [--inputs N] [--seed S] [TARGET ...]

Per target: first the regression inputs (seeds/<target>.hex) and the seeds, then a tenth of the inputs are its seeds, a tenth random bytes, the rest seeds mutated
1-4 times; a JSON target's mutants are, half of the time, changed as JSON (a value replaced by
one of another type or size, deep nesting) and signed again. An exception the decoder does not
document, a ``Broken`` re-encoding, or an input running past the hang limit (SIGALRM) counts
as a crash; the first three print a reproducer (target, seed, input number, hex). Exit 0 only
when no input crashed.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # py_targets, run as a script

import py_targets

SEEDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seeds")
HEADER = (f"{'decoder':<22} | {'inputs':>9} | {'accepted':>9} | {'rejected':>9} | "
          f"{'crashes':>7} | {'seconds':>7}")
_LENGTHS = [0, 1, 0x7F, 0x80, 0xFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 1 << 32,
            (1 << 63) - 1, 1 << 63, (1 << 64) - 1, 64 << 20]
_ODD_VALUES = [-1, 0, 1 << 64, 1e308, float("nan"), float("inf"), "", "x" * 5000, [], {},
               True, None, [[[[[]]]]], {"v": 1}, "\udcff"]
# JSON texts no json.dumps writes: an integer past Python's 4300-digit limit, deep nesting.
_RAW = ["9" * 5000, "[" * 5000 + "]" * 5000, "{\"a\":" * 3000 + "1" + "}" * 3000]
_SENTINEL = "\x00raw\x00"


class Hang(Exception):
    pass


def _on_alarm(signum, frame):
    raise Hang()


def mutate_bytes(data: bytes, seeds: list, rng: random.Random) -> bytes:
    s = bytearray(data)
    at = rng.randrange(len(s) + 1)
    kind = rng.randrange(10)
    if kind == 0 and s:
        s[at % len(s)] ^= 1 << rng.randrange(8)
    elif kind == 1 and s:
        s[at % len(s)] = rng.choice([0x00, 0xFF, 0x7F, 0x80, 0x01, 0xFE])
    elif kind == 2:
        del s[at:]
    elif kind == 3:
        s += rng.randbytes(rng.randrange(1, 33))
    elif kind == 4:  # a length field, either byte order (the Python protocols are big-endian)
        width = rng.choice([2, 4, 8])
        value = (len(s) + rng.randrange(-1, 2)) if rng.random() < 0.25 else rng.choice(_LENGTHS)
        s[at:at + width] = (value % (1 << (8 * width))).to_bytes(width, rng.choice(["big",
                                                                                    "little"]))
    elif kind == 5:
        other = rng.choice(seeds)
        s = s[:at] + other[rng.randrange(len(other) + 1):]
    elif kind == 6:
        s[at:at] = rng.randbytes(rng.randrange(1, 9))
    elif kind == 7:
        del s[at:at + rng.randrange(1, 9)]
    elif kind == 8:
        start = rng.randrange(len(s) + 1)
        s[at:at] = s[start:start + rng.randrange(1, 17)]
    else:  # a long run of one chunk: many digits, deep nesting, many entries
        start = rng.randrange(len(s) + 1)
        s[at:at] = s[start:start + rng.randrange(1, 3)] * rng.randrange(100, 6000)
    return bytes(s)


def _paths(obj, path=()):
    yield path
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, path + (i,))


def mutate_json(payload: bytes, rng: random.Random) -> bytes:
    """A value somewhere in the JSON replaced by one of another type or size, or by raw text
    (a huge integer, deep nesting)."""
    try:
        obj = json.loads(payload)
    except (ValueError, RecursionError):  # a regression input may be no JSON at all
        return payload
    path = rng.choice(list(_paths(obj)))
    raw = rng.random() < 0.2
    value = _SENTINEL if raw else rng.choice(_ODD_VALUES)
    if not path:
        obj = value
    else:
        parent = obj
        for step in path[:-1]:
            parent = parent[step]
        parent[path[-1]] = value
    text = json.dumps(obj, separators=(",", ":"))
    if raw:
        text = text.replace(json.dumps(_SENTINEL), rng.choice(_RAW))
    return text.encode()


def make_input(target, seeds: list, rng: random.Random) -> bytes:
    kind = rng.randrange(10)
    if kind == 0:
        return rng.choice(seeds)
    if kind == 1:
        return rng.randbytes(rng.randrange(256))
    data = rng.choice(seeds)
    if target.sign is not None and rng.random() < 0.5:
        data = target.sign(mutate_json(data[32:], rng))
    for _ in range(rng.randrange(1, 5)):
        data = mutate_bytes(data, seeds, rng)
    if target.sign is not None and rng.random() < 0.5:
        data = target.sign(data[32:])  # a mutant with a valid signature reaches the parser
    return data


def regression_inputs(name: str) -> list:
    """seeds/<name>.hex: inputs that once broke a decoder, one hex string a line."""
    path = os.path.join(SEEDS, name + ".hex")
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        return [bytes.fromhex(line.strip()) for line in fh
                if line.strip() and not line.startswith("#")]


def fuzz(target, inputs: int, seed: int, hang_seconds: float = 10.0) -> dict:
    """Runs the regression inputs, the seeds, then mutants, up to ``inputs`` in all."""
    rng = random.Random(f"{seed}/{target.name}")
    seeds = regression_inputs(target.name) + target.seeds(rng)
    counts = {"inputs": 0, "accepted": 0, "rejected": 0, "crashes": 0}
    start = time.monotonic()
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    try:
        for index in range(inputs):
            data = seeds[index] if index < len(seeds) else make_input(target, seeds, rng)
            signal.setitimer(signal.ITIMER_REAL, hang_seconds)
            try:
                verdict = target.run(data)
            except target.errors:
                verdict = "rejected"
            except (Exception, Hang) as exc:
                verdict = None
                counts["crashes"] += 1
                if counts["crashes"] <= 3:
                    report(target, seed, index, data, exc)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            counts["inputs"] += 1
            if verdict is not None:
                counts[verdict] += 1
    finally:
        signal.signal(signal.SIGALRM, previous)
    counts["seconds"] = time.monotonic() - start
    return counts


def report(target, seed, index, data, exc):
    shown = data.hex() if len(data) <= 256 else f"{data[:256].hex()}... ({len(data)} bytes)"
    what = "hang" if isinstance(exc, Hang) else f"{type(exc).__name__}: {str(exc)[:300]}"
    print(f"\n=== py_fuzz: {what} ===\nreproducer: target={target.name} seed={seed} "
          f"input#={index} (again: py_fuzz.py --seed {seed} --inputs {index + 1} "
          f"{target.name})\ninput: {shown}", file=sys.stderr)
    traceback.print_exception(type(exc), exc, exc.__traceback__, limit=-3, file=sys.stderr)


def row(name: str, c: dict) -> str:
    return (f"{name:<22} | {c['inputs']:>9} | {c['accepted']:>9} | {c['rejected']:>9} | "
            f"{c['crashes']:>7} | {c['seconds']:>7.1f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=10000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hang-seconds", type=float, default=10.0)
    parser.add_argument("targets", nargs="*")
    args = parser.parse_args(argv)
    by_name = {t.name: t for t in py_targets.TARGETS}
    unknown = [n for n in args.targets if n not in by_name]
    if unknown:
        parser.error(f"unknown target(s) {unknown}; known: {sorted(by_name)}")
    crashes = 0
    print(HEADER, flush=True)
    for name in args.targets or list(by_name):
        counts = fuzz(by_name[name], args.inputs, args.seed, args.hang_seconds)
        crashes += counts["crashes"]
        print(row(name, counts), flush=True)
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
