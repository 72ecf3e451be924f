"""Where a cell of the hvd cluster kernel runs: on the ranks, in the driver, or as a help query.

Pure text rules, no IPython, so they are tested as plain data. :func:`route` decides; the
kernel (hvd_magic.kernel.kernel) then hands :attr:`Route.code` to IPython in the driver, where a
ranks cell is a ``%%hvd`` cell and goes through the magics' machinery.

Rules, first match wins (blank lines and ``#`` comments never count):

A. nothing but blanks and comments: ``empty``, runs in the driver (and starts no cluster);
B. ``%%local`` first line: ``local``, the rest of the cell runs in the driver;
C. ``%%hvd [options]`` first line: ``ranks`` with those options;
D. ``%%name?`` / ``%%name??`` first line (help on a cell magic): ``local``;
E. any other cell magic first line (``%%time``, ``%%writefile``, ...): ``ranks``, the engines'
   IPython runs the magic;
F. first statement ``%hvd_...``, or every statement a line magic: ``local``
   (``%hvd_status``, ``%hvd_restart``, ``%load_ext``, ...);
G. a lone help query (``obj?``, ``obj??``, ``?obj``): ``help``, answered from rank 0;
H. anything else: ``ranks``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

RANKS, LOCAL, EMPTY, HELP = "ranks", "local", "empty", "help"

_CELL_MAGIC = re.compile(r"%%(\S*)[ \t]*(.*)")
_HELP = re.compile(r"(\?{1,2})?([A-Za-z_][\w.]*)(\?{1,2})?")


@dataclass(frozen=True)
class Route:
    """The decision for one cell.

    Attributes
    ----------
    where : str
        ``ranks``, ``local``, ``empty`` or ``help``.
    code : str
        What the driver's IPython runs: ``%%hvd [line]\\n<body>`` for ranks, the cell without
        its ``%%local`` line for local, the cell itself otherwise.
    line : str
        ``%%hvd`` options (ranks only).
    body : str
        The part of the cell that is user code: sent to the ranks, or run locally.
    body_offset : int
        Where ``body`` starts in the original cell (maps a cursor position into ``body``).
    name : str
        The object a help query asks about (help only).
    detail : int
        0 for ``obj?``, 1 for ``obj??`` (help only).
    """

    where: str
    code: str
    line: str = ""
    body: str = ""
    body_offset: int = 0
    name: str = ""
    detail: int = 0


def _statements(cell: str) -> list[str]:
    """Lines that are neither blank nor comments, stripped."""
    out = []
    for raw in cell.splitlines():
        text = raw.strip()
        if text and not text.startswith("#"):
            out.append(text)
    return out


def _first_line(cell: str) -> tuple[int, int]:
    """Start and end (exclusive, before the newline) of the first non-blank line."""
    pos = 0
    for raw in cell.splitlines(keepends=True):
        if raw.strip():
            return pos, pos + len(raw.rstrip("\r\n"))
        pos += len(raw)
    return len(cell), len(cell)


def _after_line(cell: str, end: int) -> int:
    """Index just past the newline that ends the line ending at ``end``."""
    if cell.startswith("\r\n", end):
        return end + 2
    return end + 1 if end < len(cell) else end


def ranks_code(line: str, body: str) -> str:
    """The ``%%hvd`` cell that runs ``body`` on the ranks."""
    return "%%hvd" + (f" {line}" if line else "") + "\n" + body


def route(cell: str) -> Route:
    """Decide where ``cell`` runs (see the module docstring for the rules)."""
    statements = _statements(cell)
    if not statements:
        return Route(EMPTY, cell, body=cell)
    start, end = _first_line(cell)
    first = cell[start:end].strip()
    magic = _CELL_MAGIC.fullmatch(first)
    if magic:
        name, args = magic.group(1), magic.group(2).strip()
        offset = _after_line(cell, end)
        body = cell[offset:]
        if name == "local":
            return Route(LOCAL, body, body=body, body_offset=offset)
        if name == "hvd":
            return Route(RANKS, ranks_code(args, body), line=args, body=body,
                         body_offset=offset)
        if name.endswith("?"):
            return Route(LOCAL, cell, body=cell)
        return Route(RANKS, ranks_code("", cell), body=cell)
    if statements[0].startswith("%hvd_") or all(
            s.startswith("%") and not s.startswith("%%") for s in statements):
        return Route(LOCAL, cell, body=cell)
    if len(statements) == 1:
        query = _HELP.fullmatch(statements[0])
        if query and bool(query.group(1)) != bool(query.group(3)):
            marks = query.group(1) or query.group(3)
            return Route(HELP, cell, body=cell, name=query.group(2), detail=len(marks) - 1)
    return Route(RANKS, ranks_code("", cell), body=cell)
