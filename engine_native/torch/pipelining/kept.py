"""What a stage keeps per micro-batch between its forward and its backward, counted when asked
(``schedule.count_kept = True``; otherwise nothing here runs).

A micro-batch's forward through a stage leaves behind, until its backward: the stage's input,
its output (the step holds it for the backward; on the last stage the loss holds it), and
every tensor autograd saved for the backward inside the stage. The last are seen by a
``torch.autograd.graph.saved_tensors_hooks`` pack hook around the stage's forward, which
returns the tensor unchanged. Tensors are counted once each (a Linear's saved input is the
stage's input, a Tanh's saved result its output), by data pointer and size; the stage's
parameters and buffers are not activations and are left out. With ``checkpoint=True``,
autograd saves only the checkpoint's input inside the stage, so a micro-batch keeps the two
stage-boundary tensors, its input and its output, and the output only until it is handed to its
send (Note [Sent outputs] in step_run.py; the last stage's loss holds its outputs).

Per stage, the step adds a micro-batch's figures at its forward and takes them off at its
backward; ``peak`` is the most bytes the stage held at once, with the tensors then.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Kept:
    """Tensors and their bytes kept from forwards to backwards (per micro-batch, or in all)."""
    tensors: int = 0
    bytes: int = 0

    def __add__(self, other: Kept) -> Kept:
        return Kept(self.tensors + other.tensors, self.bytes + other.bytes)

    def __sub__(self, other: Kept) -> Kept:
        return Kept(self.tensors - other.tensors, self.bytes - other.bytes)


def _key(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.numel() * t.element_size()


class KeptCounter:
    """The counting for one step over this rank's ``stages`` (index -> PipelineStage)."""

    def __init__(self, stages: dict):
        self.weights = {s: {t.data_ptr() for t in (*st.submod.parameters(),
                                                   *st.submod.buffers())}
                        for s, st in stages.items()}
        self.per_microbatch: dict[tuple[int, int], Kept] = {}   # (stage, mb) -> until its B
        self.held = {s: Kept() for s in stages}
        self.peak = {s: Kept() for s in stages}

    def forward(self, s: int, mb: int, run, x: torch.Tensor) -> torch.Tensor:
        """``run(x)``, the forward of micro-batch ``mb`` through stage ``s``, counted."""
        seen: dict[tuple[int, int], int] = {}
        weights = self.weights[s]

        def pack(t: torch.Tensor) -> torch.Tensor:
            if t.data_ptr() not in weights:
                key = _key(t)
                seen[key] = key[1]
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, _unpack):
            y = run(x)
        for t in (x, y):
            key = _key(t)
            seen[key] = key[1]
        kept = Kept(len(seen), sum(seen.values()))
        self.per_microbatch[s, mb] = kept
        self.held[s] += kept
        if self.held[s].bytes > self.peak[s].bytes:
            self.peak[s] = self.held[s]
        return y

    def handed_off(self, s: int, mb: int, y: torch.Tensor) -> None:
        """Stage ``s``'s output ``y`` for ``mb`` was handed to its send and the step no longer
        holds it (Note [Sent outputs] in step_run.py): it is counted off now, though its bytes
        go when the send completes (a copy into the channel, or the receiver's read)."""
        gone = Kept(1, _key(y)[1])
        self.per_microbatch[s, mb] -= gone
        self.held[s] -= gone

    def backward(self, s: int, mb: int) -> None:
        self.held[s] -= self.per_microbatch.pop((s, mb))


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t
