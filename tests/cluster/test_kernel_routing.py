"""Where the hvd cluster kernel runs a cell, and how completions map back into the cell.

Plain data: no kernel, no cluster (hvd_magic.kernel.routing, hvd_magic.kernel.remote).
"""

import pytest
from hvd_magic.kernel import remote
from hvd_magic.kernel.routing import EMPTY, HELP, LOCAL, RANKS, route

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("cell", ["", "\n  \n", "# just a comment\n\n# another"])
def test_empty_cells_run_locally_and_start_nothing(cell):
    r = route(cell)
    assert r.where == EMPTY and r.code == cell


@pytest.mark.parametrize("cell", [
    "x = 1",
    "import torch\nprint(hvd.rank())",
    "a = 1\n%time a",                     # a line magic among code
    "!nvidia-smi",                         # shell escapes run where the ranks are
    "print(1)  # %hvd_status",
])
def test_code_runs_on_the_ranks_as_an_hvd_cell(cell):
    r = route(cell)
    assert r.where == RANKS
    assert r.code == "%%hvd\n" + cell and r.body == cell and r.body_offset == 0


def test_explicit_hvd_cell_keeps_its_options():
    cell = "%%hvd --ranks 0 --timeout 5\nprint(1)\n"
    r = route(cell)
    assert r.where == RANKS and r.line == "--ranks 0 --timeout 5"
    assert r.code == cell and r.body == "print(1)\n"
    assert cell[r.body_offset:] == r.body


def test_other_cell_magics_run_on_the_ranks():
    r = route("%%time\nx = sum(range(10))")
    assert r.where == RANKS and r.code == "%%hvd\n%%time\nx = sum(range(10))"


@pytest.mark.parametrize("cell", ["%%local\nx = 1\nx", "\n%%local  \r\nx = 1\nx"])
def test_local_cells_drop_their_first_line(cell):
    r = route(cell)
    assert r.where == LOCAL and r.code == "x = 1\nx"
    assert cell[r.body_offset:] == r.body == r.code


@pytest.mark.parametrize("cell", [
    "%hvd_status",
    "%hvd_start -n 2 --launcher local\nprint('started')",  # starts with %hvd_: all local
    "%load_ext autoreload\n# comment\n%autoreload 2",        # only line magics
    "%%local?",                                              # help on a cell magic
    "%%hvd??",
])
def test_hvd_and_line_magic_cells_run_locally(cell):
    r = route(cell)
    assert r.where == LOCAL and r.code == cell


@pytest.mark.parametrize("cell, name, detail", [
    ("model?", "model", 0), ("model.fc1??", "model.fc1", 1), ("?hvd.allreduce", "hvd.allreduce", 0),
    ("  x?  ", "x", 0),
])
def test_lone_help_queries_are_answered_from_rank_0(cell, name, detail):
    r = route(cell)
    assert (r.where, r.name, r.detail) == (HELP, name, detail)


@pytest.mark.parametrize("cell", ["x = 1\nx?", "?x?"])
def test_help_among_code_runs_on_the_ranks(cell):
    assert route(cell).where == RANKS


def test_completion_positions_shift_back_into_the_cell():
    reply = {"matches": ["only_on_rank0"], "cursor_start": 0, "cursor_end": 9, "status": "ok",
             "metadata": {"_jupyter_types_experimental": [
                 {"start": 0, "end": 9, "text": "only_on_rank0", "type": "instance"}]}}
    shifted = remote.shift_completion(reply, 16)
    assert (shifted["cursor_start"], shifted["cursor_end"]) == (16, 25)
    assert shifted["metadata"]["_jupyter_types_experimental"][0]["start"] == 16
    assert reply["cursor_start"] == 0  # the original is left alone
    assert remote.shift_completion(reply, 0) is reply
