"""What a notebook's code cell showed, as text, for the tests that run the shipped notebooks
headless (tests/cluster/test_notebooks.py and test_kernel_notebook.py,
tests/launch/test_notebook.py)."""


def cell_text(cell) -> str:
    """The cell's streams, each result's text/plain and each error's ``name: value``, in order."""
    parts = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type in ("execute_result", "display_data"):
            parts.append(out.data.get("text/plain", "") + "\n")
        elif out.output_type == "error":
            parts.append(f"{out.ename}: {out.evalue}\n")
    return "".join(parts)
