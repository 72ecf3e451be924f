"""``python -m hvd_magic.demo`` runs a notebook headless and prints its outputs; its kernel talks
over Unix sockets, so ipykernel does not warn about plain-text TCP (the full quickstart runs in
tests/cluster/test_notebooks.py)."""
import nbformat

from hvd_magic import demo


def test_the_demo_prints_outputs_over_a_kernel_without_tcp(tmp_path, capfd):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "import json, os\nprint('answer', 6 * 7)\n"
        "cf = json.load(open(os.environ.get('JPY_CONNECTION_FILE') or "
        "__import__('ipykernel').get_connection_file()))\nprint('transport', cf['transport'])")]
    path = tmp_path / "tiny.ipynb"
    nbformat.write(nb, path)
    assert demo.main([str(path)]) == 0
    out, err = capfd.readouterr()
    assert "answer 42" in out and "transport ipc" in out, out + err
    assert "without encryption" not in out + err
