"""notebooks/cluster_kernel.ipynb runs top to bottom on the hvd cluster kernel, as CI runs it.

The kernelspec the notebook names is installed into a temporary prefix and found through
JUPYTER_PATH (never the user's folders), with two ranks on the local launcher. The kernel gets
``HVD_TEST_TAG``; whatever it and its cluster leave running is killed afterwards, and the test
fails if anything was.
"""

import os
import subprocess
import sys

import nbformat
import pytest
from cluster_harness import REPO, run_notebook
from hvd_magic.kernel import DEFAULT_NAME
from notebook_cells import cell_text, per_rank

pytestmark = pytest.mark.timeout(600)

NOTEBOOK = os.path.join(REPO, "notebooks", "cluster_kernel.ipynb")


@pytest.fixture
def kernelspec(tmp_path, monkeypatch):
    subprocess.run([sys.executable, "-m", "hvd_magic.kernel", "install", "--prefix",
                    str(tmp_path), "-n", "2", "--launcher", "local", "--start-args",
                    "--gpus none"], check=True, capture_output=True, timeout=120)
    monkeypatch.setenv("JUPYTER_PATH", os.path.join(str(tmp_path), "share", "jupyter"))
    return DEFAULT_NAME


def test_cluster_kernel_notebook(kernelspec):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert nb.metadata.kernelspec.name == kernelspec
    run_notebook(nb, os.path.dirname(NOTEBOOK), settle_s=30, startup_timeout=120)

    code = [c for c in nb.cells if c.cell_type == "code"]
    text = [cell_text(c) for c in code]
    assert "hvd cluster: 2 ranks, local launcher" in text[0]
    assert "[rank 0] rank 0 of 2" in text[0] and "[rank 1] rank 1 of 2" in text[0]
    assert per_rank(text[1], "sum over ranks: ", 2) == ["[3.0, 3.0, 3.0]"] * 2, text[1]
    assert "the driver is process" in text[2] and "rank" not in text[2]  # %%local: the driver
    assert "hvd: pushed lr, steps to all ranks" in text[3]
    assert "[rank 0] step 0: loss on my shard" in text[4]
    errors = per_rank(text[4], "largest weight error: ", 2)
    assert None not in errors and max(float(e.split()[0]) for e in errors) < 0.05, text[4]
    assert "pulled weights from rank 0" in text[5]
    assert "rank 0's weights, now in the driver: [-1.0," in text[6]
    assert "CellInterrupted" in text[7] and "--timeout 3" in text[7], text[7]
    errors = [o for o in code[7].outputs if o.output_type == "error"]
    assert "stuck in allreduce 'only_rank_0'" in "\n".join(errors[0].traceback)
    assert per_rank(text[8], "still usable: ", 2) == ["2.0"] * 2, text[8]
    assert "idle" in text[9]
    assert "hvd: cluster stopped" in text[10]
