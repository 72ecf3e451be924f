"""notebooks/migrate_to_jobs.ipynb runs headless through nbclient (hvd_magic.run,
HorovodRunner(np=-2), hvdrun; no Spark, no cluster) and leaves no process behind."""
import os
import shutil

import nbformat
import pytest
from nbclient import NotebookClient
from notebook_cells import cell_text

import hvd_magic

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(420)]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOK = os.path.join(REPO, "notebooks", "migrate_to_jobs.ipynb")


def test_migrate_to_jobs_notebook(no_leaks):
    # Everything the notebook uses is the project's or the test extra's: no skips.
    assert callable(hvd_magic.run) and callable(hvd_magic.HorovodRunner)
    assert shutil.which("hvdrun"), ("the hvdrun console script is not on PATH: install the "
                                    "project (./dev.sh test, or pip install -e .)")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=False,
                            resources={"metadata": {"path": os.path.dirname(NOTEBOOK)}})
    client.execute(env=dict(os.environ))
    code = [c for c in nb.cells if c.cell_type == "code"]
    text = "\n".join(cell_text(c) for c in code)
    assert "[0]<stdout>:epoch 1: loss" in text, text
    assert "[(0, " in text and "(1, " in text  # hvd_magic.run: one result per rank
    assert "rank 0 accuracy" in text  # HorovodRunner: rank 0's value
    assert "UnpicklableError" in text and "global 'log'" in text
    hvdrun_out = cell_text(next(c for c in code if "!hvdrun" in c.source))
    assert "[0]<stdout>:epoch 0: loss" in hvdrun_out, hvdrun_out
