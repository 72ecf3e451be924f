"""The main job: ``python -m hvd_magic.demo [notebook]`` (what ``./dev.sh demo`` runs).

Executes ``notebooks/quickstart.ipynb`` headless with nbclient (4 MPI ranks start, an
allreduce, digits training with DistributedOptimizer, accuracy and throughput, stop) and prints
each code cell's text output, so a fresh machine shows the product working end to end.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
# An installed wheel carries the notebooks as hvd_magic/notebooks (setup.py); a checkout (an
# editable install) has them at the top level.
DEFAULT_NOTEBOOK = next((p for p in (_HERE / "notebooks" / "quickstart.ipynb",
                                     _HERE.parent / "notebooks" / "quickstart.ipynb")
                         if p.exists()), _HERE / "notebooks" / "quickstart.ipynb")


def _text(output) -> str:
    if output.get("output_type") == "stream":
        return output.get("text", "")
    data = output.get("data", {})
    return data.get("text/plain", "") + ("\n" if "text/plain" in data else "")


def _ipc_kernel(folder: str):
    """The notebook's kernel talks to us over Unix sockets in ``folder`` (only this user can
    reach them), not TCP: nothing is sent in plain text over the network, and ipykernel has
    no reason to warn that it is."""
    from traitlets.config import Config

    config = Config()
    config.KernelManager.transport = "ipc"
    config.KernelManager.ip = os.path.join(folder, "kernel")
    return config


def main(argv: list[str]) -> int:
    import nbclient
    import nbformat

    path = Path(argv[0]) if argv else DEFAULT_NOTEBOOK
    if not path.exists():
        print(f"demo: {path} not found; reinstall hvd-magic (its wheel carries the notebooks) "
              f"or pass a notebook: python -m hvd_magic.demo path/to/notebook.ipynb",
              file=sys.stderr)
        return 2
    os.environ.setdefault("IPP_NONINTERACTIVE", "1")  # grouped, deterministic output
    notebook = nbformat.read(path, as_version=4)
    print(f"running {path} headless ...", flush=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hvd-demo-") as sockets:
        # The notebook runs in its own folder, unless that is a read-only site-packages.
        cwd = str(path.parent) if os.access(path.parent, os.W_OK) else sockets
        client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                         config=_ipc_kernel(sockets),
                                         resources={"metadata": {"path": cwd}})
        try:
            client.execute()
        except nbclient.exceptions.CellExecutionError as err:
            print(f"demo: a cell failed:\n{err}", file=sys.stderr)
            return 1
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        print(f"\n>>> {cell.source.splitlines()[0] if cell.source else ''}")
        for output in cell.get("outputs", []):
            text = _text(output).rstrip()
            if text:
                print(text)
    print(f"\nquickstart finished in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
