"""The shipped notebooks run headless, top to bottom, through nbclient (as CI runs them), and
one written here for the TensorFlow binding, which no shipped notebook starts.

Each notebook's kernel gets ``HVD_TEST_TAG`` in its environment; every process it spawns
(controller, mpiexec, engines) inherits it, so whatever the notebook leaves running is found
and killed afterwards, and the test fails if anything was left.

nbclient is a widget frontend: the dashboard is the widget view, and :func:`dashboard_rates`
reads the throughput its rank rows showed from the widget updates the kernel sent."""

import os
import re

import nbformat
import pytest
from cluster_harness import REPO, run_notebook
from notebook_cells import cell_text, per_rank

pytestmark = [pytest.mark.timeout(420), pytest.mark.mpi]

NOTEBOOKS = os.path.join(REPO, "notebooks")
# A rank row of the dashboard's widget view (hvd_magic/widgets/view.py: row_html) and its
# throughput cell when the rank reported samples (as tests/cluster/test_dashboard_kernel.py
# reads it).
ROW = re.compile(r'class="hvd-row" data-rank="(\d+)"')
RATE = re.compile(r'class="hvd-rate"[^>]*>([0-9.]+)([kMG]?) samples/s<')
SCALE = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9}


@pytest.fixture
def dashboard_rates(monkeypatch):
    """{rank: [samples/s]}: every throughput in samples/s that the dashboard's row of each rank
    showed while the notebook ran, read from the widget state updates nbclient receives (the
    notebook's saved widget state keeps only the last one, sent after training, when the rate
    over the dashboard's 2 s window may already be back at 0)."""
    from nbclient import NotebookClient

    rates: dict = {}
    handle = NotebookClient.handle_comm_msg

    def record(self, outs, msg, cell_index):
        value = msg["content"].get("data", {}).get("state", {}).get("value")
        row = ROW.search(value) if isinstance(value, str) else None
        rate = RATE.search(value) if row else None
        if rate:
            rates.setdefault(int(row[1]), []).append(float(rate[1]) * SCALE[rate[2]])
        return handle(self, outs, msg, cell_index)

    monkeypatch.setattr(NotebookClient, "handle_comm_msg", record)
    return rates


def assert_samples_per_s_on_every_row(rates: dict, n: int) -> None:
    """Every rank's ``hvd.report(samples=...)`` reached the dashboard: its row showed a
    non-zero samples/s."""
    assert sorted(rates) == list(range(n)) and all(max(v) > 0 for v in rates.values()), rates


def execute(name: str):
    nb = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
    return run_notebook(nb, NOTEBOOKS, kernel_name="python3")


def test_quickstart(dashboard_rates):
    nb = execute("quickstart.ipynb")
    text = "\n".join(cell_text(c) for c in nb.cells if c.cell_type == "code")
    assert "hvd cluster: 4 ranks, mpi launcher" in text
    assert per_rank(text, "sum over ranks: ", 4) == ["[6.0, 6.0, 6.0]"] * 4, text
    assert "[rank 0] epoch 9: loss" in text
    accuracy = per_rank(text, "test accuracy: ", 4)  # equal parameters on every rank
    assert len(set(accuracy)) == 1 and float(accuracy[0]) > 0.85, text
    assert "samples/s on 4 ranks" in text
    assert_samples_per_s_on_every_row(dashboard_rates, 4)
    assert "hvd: cluster stopped" in text


def test_elastic():
    nb = execute("elastic.ipynb")
    text = "\n".join(cell_text(c) for c in nb.cells if c.cell_type == "code")
    assert "scaled from 2 to 4 ranks" in text
    assert "[rank 0] 0 4 0 set on rank 0 of 2" in text and "[rank 3] 3 4 3 None" in text
    assert "rank 3 died (killed by SIGKILL" in text and "re-formed as generation" in text
    line = text.split("size 3: accuracy ")[1].splitlines()[0]
    assert float(line.split(",")[0]) > 0.9 and line.endswith("once each: True"), line
    assert "after the replacement: 4 ranks; sum 4.0" in text
    assert "elastic: generation" in text and "rank 3 (pid" in text  # %hvd_status
    assert "killed by SIGKILL" in text.split("elastic: generation")[1]
    assert "hvd: cluster stopped" in text


def test_pipeline():
    nb = execute("pipeline.ipynb")
    text = "\n".join(cell_text(c) for c in nb.cells if c.cell_type == "code")
    assert "[rank 0] my blocks: [[0, 1, 2]]" in text and "[rank 1] my blocks: [[3, 4, 5]]" \
        in text, text
    two = float(text.split("[rank 1] 2 stages: test accuracy ")[1].split()[0])
    counts = per_rank(text, "blocks per stage: ", 4)  # one split, the same on every rank
    assert len(set(counts)) == 1 and sum(int(c) for c in counts[0].strip("[]").split(",")) \
        == 6, counts
    four = text.split("[rank 3] 4 stages: test accuracy ")[1].split()[0]
    assert f"[rank 0] gathered model: test accuracy {four}" in text, text
    assert two > 0.75 and float(four) > 0.75, (two, four)  # (deterministic: seeded, exact)
    assert "hvd: cluster stopped" in text


@pytest.mark.jax
def test_jax(dashboard_rates):
    nb = execute("jax.ipynb")
    text = "\n".join(cell_text(c) for c in nb.cells if c.cell_type == "code")
    # %hvd_start --framework jax: engine_native.jax is hvd on both ranks
    assert len(re.findall(r"engine_native\.jax +idle", text)) == 2, text
    assert per_rank(text, "sum over ranks: ", 2) == ["[1.0, 3.0, 5.0]"] * 2, text
    assert per_rank(text, "in jit: ", 2) == ["[0.5, 2.5, 6.5]"] * 2, text
    accuracy = per_rank(text, "test accuracy: ", 2)
    assert accuracy[0] == accuracy[1] and float(accuracy[0]) > 0.85, text  # equal parameters
    assert per_rank(text, "parameters equal on every rank: ", 2) == ["True"] * 2, text
    assert_samples_per_s_on_every_row(dashboard_rates, 2)  # hvd.report in the training loop
    assert "hvd: cluster stopped" in text


@pytest.mark.keras
def test_keras(dashboard_rates):
    nb = execute("keras.ipynb")
    text = "\n".join(cell_text(c) for c in nb.cells if c.cell_type == "code")
    assert len(re.findall(r"engine_native\.keras +idle", text)) == 2, text
    starts = per_rank(text, "initial weights sum: ", 2)
    assert None not in starts and starts[0] != starts[1], text  # before the broadcast
    losses = text.split("[rank 0] loss per epoch: [")[1].split("]")[0].split(", ")
    assert float(losses[-1]) < float(losses[0]) / 4, losses
    accuracy = per_rank(text, "test accuracy: ", 2)
    assert accuracy[0] == accuracy[1] and float(accuracy[0]) > 0.85, text  # equal weights
    assert per_rank(text, "weights equal on every rank: ", 2) == ["True"] * 2, text
    assert_samples_per_s_on_every_row(dashboard_rates, 2)  # hvd.report in a fit callback
    assert "hvd: cluster stopped" in text


TENSORFLOW = [
    "%load_ext hvd_magic\n%hvd_start -n 2 --launcher local --framework tensorflow",
    """%%hvd
x = tf.range(3.0) + hvd.rank()
print("hvd is", hvd.__name__)
print("sum over ranks:", hvd.allreduce(x, op=hvd.Sum).numpy().tolist())
import time
for step in range(60):  # steps of a few ms, over several of the dashboard's snapshots
    hvd.allreduce(tf.ones(256), name="grad")
    hvd.report(samples=16)
    time.sleep(0.03)""",
    "%hvd_stop",
]


@pytest.mark.tensorflow
def test_tensorflow(dashboard_rates):
    """``%hvd_start --framework tensorflow``: engine_native.tensorflow is ``hvd`` (and
    TensorFlow ``tf``) on every rank, a collective works, and ``hvd.report`` feeds the
    dashboard as torch's does (the binding's ops themselves: tests/frameworks). One cluster
    start, the cost of the cluster tier: ``--framework torch`` named explicitly is the shared
    cluster's (tests/cluster/conftest.py), keras and jax are the notebooks' above."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in TENSORFLOW])
    nb = run_notebook(nb, NOTEBOOKS, kernel_name="python3")
    text = "\n".join(cell_text(c) for c in nb.cells)
    assert len(re.findall(r"engine_native\.tensorflow +idle", text)) == 2, text
    assert per_rank(text, "hvd is ", 2) == ["engine_native.tensorflow"] * 2, text
    assert per_rank(text, "sum over ranks: ", 2) == ["[1.0, 3.0, 5.0]"] * 2, text
    assert_samples_per_s_on_every_row(dashboard_rates, 2)
    assert "hvd: cluster stopped" in text
