"""What a notebook's code cell showed, as text, for the tests that run the shipped notebooks
headless (tests/cluster/test_notebooks.py and test_kernel_notebook.py,
tests/launch/test_notebook.py), and what each rank printed in a ``%%hvd`` cell's text."""

import re


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


def per_rank(text: str, label: str, n: int, ran=None) -> list:
    """Each of the n ranks' value of the lines ``<label><value>`` it printed, whatever the
    prefix: ``[all ranks]`` (the ``ran`` ranks, which ran the cell; every rank by default),
    ``[ranks 0,2]`` or ``[rank r]``: ranks whose identical lines arrive far enough apart are
    shown apart or in groups (Note [Collapsing] C in hvd_magic/output.py). None for a rank
    that printed no such line."""
    from hvd_magic.ranks import parse_ranks

    values = [None] * n
    everyone = list(range(n)) if ran is None else list(ran)
    for prefix, value in re.findall(r"\[(all ranks|ranks? [0-9,\-]+)\] " + re.escape(label) +
                                    r"(.*)", text):
        ranks = everyone if prefix == "all ranks" else parse_ranks(prefix.split()[1], n)
        for r in ranks:
            values[r] = value.strip()
    return values
