"""Rank lists: parse ``--ranks SPEC`` and format rank sets for prefixes and reports.

Used by the magics (parsing), the output collapser (prefixes such as ``[ranks 0-2]``) and the
error and stuck reports. Pure functions, no IPython.
"""

from __future__ import annotations

from collections.abc import Iterable


def parse_ranks(spec: str | None, size: int) -> list[int]:
    """Turn a ``--ranks`` spec into a sorted list of ranks in ``[0, size)``.

    Accepted: ``all`` (or empty), ``3``, ``0,2,5``, ranges ``1-3`` (inclusive), Python slices
    ``::2`` / ``1:3`` / ``-1:``, and combinations ``0,4-6``.

    Examples
    --------
    >>> parse_ranks("0,2-3", 4)
    [0, 2, 3]
    >>> parse_ranks("::2", 5)
    [0, 2, 4]
    """
    if spec is None or spec.strip() in ("", "all", "*"):
        return list(range(size))
    chosen: set[int] = set()
    for part in spec.replace(" ", "").split(","):
        if not part:
            continue
        if ":" in part:
            chosen.update(range(size)[_slice(part, spec)])
            continue
        lo, dash, hi = part.partition("-")
        if dash and lo:
            first, last = _int(lo, spec), _int(hi, spec)
            if last < first:
                raise ValueError(f"--ranks {spec!r}: range {part!r} is empty (write {hi}-{lo})")
            chosen.update(range(first, last + 1))
        else:
            value = _int(part, spec)
            chosen.add(value + size if value < 0 else value)  # -1 is the last rank
    bad = sorted(r for r in chosen if not 0 <= r < size)
    if bad:
        raise ValueError(f"--ranks {spec!r}: rank(s) {format_ranks(bad)} out of range; "
                         f"the cluster has ranks 0-{size - 1}")
    if not chosen:
        raise ValueError(f"--ranks {spec!r} selects no rank (the cluster has ranks 0-{size - 1})")
    return sorted(chosen)


def _int(text: str, spec: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"--ranks {spec!r}: {text!r} is not a rank; use e.g. 0,2 or 1-3 or ::2")


def _slice(part: str, spec: str) -> slice:
    fields = part.split(":")
    if len(fields) > 3:
        raise ValueError(f"--ranks {spec!r}: {part!r} is not a slice")
    return slice(*[_int(f, spec) if f else None for f in fields])


def format_ranks(ranks: Iterable[int]) -> str:
    """Compact text for a set of ranks: ``0-3``, ``0,2``, ``0-2,5``.

    >>> format_ranks([3, 0, 1, 2, 7])
    '0-3,7'
    """
    values = sorted(set(ranks))
    runs: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        if j - i >= 2:
            runs.append(f"{values[i]}-{values[j]}")
        else:
            runs.extend(str(v) for v in values[i:j + 1])
        i = j + 1
    return ",".join(runs)


def rank_label(ranks: Iterable[int], everyone: Iterable[int]) -> str:
    """Prefix naming who produced something: ``all ranks``, ``rank 2`` or ``ranks 0,2``."""
    group, world = set(ranks), set(everyone)
    if group == world and len(world) > 1:
        return "all ranks"
    if len(group) == 1:
        return f"rank {next(iter(group))}"
    return f"ranks {format_ranks(group)}"
