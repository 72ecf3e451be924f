"""A pipeline rank's last step on the dashboard (widgets/pipeline_step.py and its strip in
sparkline.py, view.py, text.py): the snapshot field is checked like any other (a bad one is
dropped whole, the rest of the snapshot kept), the model hands it out with the rank's row, and
the row draws it as a strip of forward and backward boxes with the measured bubble beside the
schedule's ideal, in place of the reported "bubble" text."""
import copy
import json
import math
import re

import pytest

from hvd_magic.widgets import model as M
from hvd_magic.widgets import pipeline_step as P
from hvd_magic.widgets import publisher as Pub
from hvd_magic.widgets import snapshot as S
from hvd_magic.widgets import text as T
from hvd_magic.widgets import view as V
from hvd_magic.widgets.sparkline import pipeline_strip

pytestmark = pytest.mark.timeout(30)

KEY = b"k" * 32
# rank 1 of a 2-rank 1F1B step with M = 2: idle while rank 0 starts, between F1 and B0, ...
STEP = {"schedule": "1f1b", "step_s": 0.02, "bubble": 0.35, "ideal": 1 / 3,
        "actions": [["F", 1, 0, 0.002, 0.004], ["B", 1, 0, 0.004, 0.008],
                    ["F", 1, 1, 0.01, 0.012], ["B", 1, 1, 0.012, 0.016]], "more": 0}


def snap(**fields):
    return {"v": 1, "rank": 1, "t": 5.0, "seq": 1, "pub": "p1", "pid": 7, "host": "n1",
            "busy": True, "cell": "train()", "extra": {"loss": 0.5, "bubble": "35% (ideal 33%)"},
            "core": {"ops": {"send": 4}, "bytes": {"send": 64}}, **fields}


def test_a_step_crosses_the_wire_unchanged():
    got = S.unpack(S.pack(snap(pipeline=STEP), KEY), KEY)
    assert got["pipeline"] == STEP
    assert S.validate(json.loads(json.dumps(got))) == got


def _broken(path, value):
    step = copy.deepcopy(STEP)
    *where, last = path
    target = step
    for key in where:
        target = target[key]
    if value is _DELETE:
        del target[last]
    else:
        target[last] = value
    return step


_DELETE = object()
BAD = [
    ("not a dict", ["F", 0, 0, 0, 1]),
    ("step_s missing", _broken(("step_s",), _DELETE)),
    ("step_s zero", _broken(("step_s",), 0)),
    ("step_s a day and more", _broken(("step_s",), 1e9)),
    ("step_s a string", _broken(("step_s",), "0.02")),
    ("step_s a bool", _broken(("step_s",), True)),
    ("bubble over 1", _broken(("bubble",), 1.5)),
    ("bubble negative", _broken(("bubble",), -0.1)),
    ("ideal NaN", _broken(("ideal",), math.nan)),
    ("ideal infinite", _broken(("ideal",), math.inf)),
    ("schedule not text", _broken(("schedule",), ["1f1b"])),
    ("more negative", _broken(("more",), -1)),
    ("more past 64 bits", _broken(("more",), 1 << 64)),
    ("actions not a list", _broken(("actions",), {"F": 1})),
    ("one action too many", _broken(("actions",), STEP["actions"] * 64 + [STEP["actions"][0]])),
    ("an unknown kind", _broken(("actions", 0, 0), "SEND_F")),
    ("an action of 4", _broken(("actions", 1), ["B", 1, 0, 0.004])),
    ("an action not a list", _broken(("actions", 1), "B 1 0")),
    ("a stage negative", _broken(("actions", 0, 1), -1)),
    ("a stage a bool", _broken(("actions", 0, 1), True)),
    ("a micro-batch huge", _broken(("actions", 2, 2), 1 << 40)),
    ("a micro-batch a float", _broken(("actions", 2, 2), 1.0)),
    ("a start before the step", _broken(("actions", 0, 3), -0.001)),
    ("an end before its start", _broken(("actions", 1, 4), 0.003)),
    ("an end after the step", _broken(("actions", 3, 4), 0.03)),
    ("a time past float", _broken(("actions", 3, 4), 10 ** 400)),
]


@pytest.mark.parametrize("what, bad", BAD, ids=[b[0] for b in BAD])
def test_a_bad_step_is_dropped_and_nothing_else(what, bad):
    got = S.validate(snap(pipeline=bad))
    assert "pipeline" not in got, what
    assert got == S.validate(snap())  # the rest of the snapshot is all there


def test_the_largest_step_allowed_passes():
    step = _broken(("actions",), STEP["actions"] * (P.MAX_ACTIONS // 4))
    step["more"] = 3
    assert len(step["actions"]) == P.MAX_ACTIONS
    assert S.validate(snap(pipeline=step))["pipeline"] == step


def test_the_publisher_sends_the_last_step_once_a_step_ran(monkeypatch):
    import types
    pub = Pub.Publisher("tcp://127.0.0.1:1", rank=1)
    monkeypatch.delitem(Pub.sys.modules, "engine_native.pipeline.last_step", raising=False)
    assert "pipeline" not in pub.snapshot()  # (nor is the module imported to find out)
    assert "engine_native.pipeline.last_step" not in Pub.sys.modules
    fake = types.SimpleNamespace(latest=lambda: STEP)
    monkeypatch.setitem(Pub.sys.modules, "engine_native.pipeline.last_step", fake)
    assert S.unpack(S.pack(pub.snapshot(), KEY), KEY)["pipeline"] == STEP


def _row(**fields):
    m = M.DashboardModel()
    m.ingest(1, S.validate(snap(**fields)), now=1.0)
    return m.rows(1.0)[0]


def test_the_row_carries_the_step_and_draws_it_in_place_of_the_reported_text():
    row = _row(pipeline=STEP)
    assert row.pipeline == M.PipelineStep("1f1b", 0.02, 0.35, 1 / 3,
                                          tuple(map(tuple, STEP["actions"])), 0)
    html = V.row_html(row)
    assert "bubble 35.0% (ideal 33.3%)" in html and "1f1b step 20.0 ms" in html
    assert "bubble=" not in html and "loss=0.5" in html  # the strip replaces the extra slot
    assert "pipeline bubble 35.0% (ideal 33.3%)" in T.row_text(row)
    plain = _row()  # no pipeline step: the row is as before, the report's text included
    assert plain.pipeline is None
    assert "hvd-pipeline" not in V.row_html(plain) and "bubble=35% (ideal 33%)" in V.row_html(plain)
    assert "pipeline" not in T.row_text(plain)


def test_the_strip_places_boxes_by_time_and_numbers_those_wide_enough():
    step = _row(pipeline=STEP).pipeline
    svg = pipeline_strip(step, width=200)
    boxes = re.findall(r'<rect class="hvd-(\w+)" x="([\d.]+)" y="0" width="([\d.]+)"', svg)
    # 200 px for 20 ms: 10 px a millisecond, the idle gaps (0-2, 8-10, 16-20 ms) left grey
    assert boxes == [("forward", "20.0", "20.0"), ("backward", "40.0", "40.0"),
                     ("forward", "100.0", "20.0"), ("backward", "120.0", "40.0")]
    assert '<rect x="0" y="0" width="200.0" height="14" fill="#e4e4e4">' in svg  # the step
    assert re.findall(r">(\d+)</text>", svg) == ["0", "0", "1", "1"]
    assert "<title>backward of micro-batch 1, stage 1: 4.00 ms</title>" in svg
    # on the slowest rank's 40 ms scale in 100 px the same step fills half the width and the
    # 5-px forwards are too narrow for a number
    half = pipeline_strip(step, span_s=0.04, width=100)
    assert '<rect x="0" y="0" width="50.0"' in half
    assert re.findall(r">(\d+)</text>", half) == ["0", "1"]


def test_every_ranks_strip_shares_the_slowest_steps_scale():
    m = M.DashboardModel()
    slow = dict(STEP, step_s=0.04)
    m.ingest(0, S.validate(dict(snap(pipeline=slow), rank=0)), now=1.0)
    m.ingest(1, S.validate(snap(pipeline=STEP)), now=1.0)
    v = V.DashboardView()
    v.update(m, 1.0)
    r0, r1 = (w.value for w in v.rows_box.children[1:])
    assert '<rect x="0" y="0" width="480.0"' in r0 and '<rect x="0" y="0" width="240.0"' in r1


def test_a_step_cut_at_the_cap_says_so():
    row = _row(pipeline=dict(STEP, more=60))
    assert "first 4 of 64 actions" in V.row_html(row)
