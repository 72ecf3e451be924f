"""The input transformer that turns a ``%%hvd`` cell into ``await hvd_magic.cell_async(...)``,
so the notebook awaits the ranks instead of blocking (registered by ``%load_ext hvd_magic``).
"""

from __future__ import annotations

CELL_PREFIX = "get_ipython().run_cell_magic('hvd', "


def async_cell_transform(shell):
    """An ``input_transformers_post`` entry turning a ``%%hvd`` cell into an awaited call, when
    IPython can run top-level ``await`` with asyncio (ipykernel, plain IPython)."""
    from IPython.core.async_helpers import _asyncio_runner

    def transform(lines):
        if not lines or not lines[0].startswith(CELL_PREFIX):
            return lines
        if not shell.autoawait or shell.loop_runner is not _asyncio_runner:
            return lines
        rest = lines[0][len(CELL_PREFIX):]
        return ["await __import__('hvd_magic').cell_async(" + rest] + lines[1:]

    return transform
