"""One pipeline step on one rank: run this rank's program of the schedule's action table over
the rank's stages, moving activations and gradients with ``engine_native`` point-to-point.

Note [Pipeline step failures]: a step is a collective of the pipeline's ranks. When one rank
fails (its stage raises, a receive times out, a peer is lost), the others would wait in
receives until HVD_TIMEOUT, and messages of the failed step could be taken by the next one.
So the failing rank aborts the world's ops (``engine_native.abort``; every process set's) with
a reason naming its stage, the action and the micro-batch: every other rank's pending receive
fails at once with that reason, wrapped in its own stage and action. A rank that already
finished its part of the step (the last stage, once its gradients are written) has returned
and learns of it at its next call. Every rank raises ``PipelineError``
(a ``HorovodInternalError``); ``shutdown()`` + ``init()`` start clean in the same processes,
and a notebook's ``%%hvd`` cell does that by itself.
"""
from __future__ import annotations

import collections
import os
import re
import time

import torch

import engine_native as _engine
from engine_native.pipeline import activity
from engine_native.torch.p2p_ops import USER_TAGS, raw_irecv, raw_isend, raw_recv_now

from .grad_average import GradAverage

# Pipeline messages use tags from here up, out of the way of a program's own tags.
TAG_BASE = USER_TAGS


class PipelineError(_engine.HorovodInternalError):
    """A pipeline step failed; the message names the stage, the action and the micro-batch."""


def stream_ordered_receives() -> bool:
    """HVD_PIPELINE_STREAM_RECV: "1", a GPU stage's receive by CUDA IPC (or NCCL) returns once
    its copy (its ncclRecv) is queued, final in the stage's current stream's order (Note [Device
    point-to-point] I: its thread goes on queueing kernels; a sender that dies mid-transfer
    leaves that stream stuck, or by NCCL going on with bytes never written); "0" or unset, once
    the bytes are there."""
    value = os.environ.get("HVD_PIPELINE_STREAM_RECV", "0")
    if value not in ("0", "1"):
        raise ValueError(f"HVD_PIPELINE_STREAM_RECV={value!r}: expected 0 or 1")
    return value == "1"


def forward_tag(stage: int, microbatch: int, microbatches: int) -> int:
    """The tag of stage ``stage``'s output for ``microbatch`` (sent to stage + 1)."""
    return TAG_BASE + 2 * (stage * microbatches + microbatch)


def backward_tag(stage: int, microbatch: int, microbatches: int) -> int:
    """The tag of the gradient of stage ``stage``'s output (sent back by stage + 1)."""
    return forward_tag(stage, microbatch, microbatches) + 1


def stages_of_ranks_named(text: str, stage, named: set) -> str:
    """"; rank 0 holds stage 0" for each pipeline rank that ``text`` (a core error: it names
    ranks) mentions and neither it ("stage 1 (rank 1)", a relayed PipelineError) nor the
    message around it (``named``) names with its stage, so an error that reached this rank
    through another one still names the stage at fault: a stopped stage 0 is "rank 0 ... is
    stopped" in the cause that stage 2 reports."""
    held: dict = {}
    for s in range(stage.num_stages):
        held.setdefault(stage.rank_of(s), []).append(s)
    # global ranks ("set rank 0", "local rank 1" are not), less those named with a stage
    mentioned = {int(r) for r in re.findall(r"(?<!set )(?<!local )\brank (\d+)", text)}
    for with_stage in re.findall(r"\bstage \d+ \(rank (\d+)\)|\brank (\d+) holds stage", text):
        mentioned -= {int(r) for r in with_stage if r}
    parts = []
    for r in sorted(mentioned & set(held) - named):
        stages = held[r]
        parts.append(f"rank {r} holds stage{'s' if len(stages) > 1 else ''} "
                     f"{', '.join(str(s) for s in stages)}")
    return "".join("; " + p for p in parts)


def doing(action, stage_rank) -> str:
    """``action`` as the stuck report shows it: "pipeline stage 1, in the forward of
    micro-batch 1" (Note in engine_native/pipeline/activity.py)."""
    verb = "in " if action.kind in ("F", "B") else ""
    return f"pipeline stage {action.stage}, {verb}{describe(action, stage_rank)}"


_FINISHING = "completing its sends and gradient averages"


def _finishing(stage: int) -> str:
    return f"pipeline stage {stage}, {_FINISHING}"


# A hand-off's words and the stage it names, relative to its own.
_HAND_OFFS = {"RECV_F": ("receiving", "activations", "from", -1),
              "SEND_F": ("sending", "activations", "to", 1),
              "RECV_B": ("receiving", "gradient", "from", 1),
              "SEND_B": ("sending", "gradient", "to", -1)}


def describe(action, stage_rank) -> str:
    mb = action.microbatch
    if action.kind == "F":
        return f"the forward of micro-batch {mb}"
    if action.kind == "B":
        return f"the backward of micro-batch {mb}"
    verb, what, way, step = _HAND_OFFS[action.kind]
    peer = action.stage + step
    return f"{verb} micro-batch {mb}'s {what} {way} stage {peer} (rank {stage_rank(peer)})"


class StepRun:
    """The state of one step: per (stage, micro-batch) the input, output and gradients.

    ``stages``: this rank's PipelineStages by index; ``inputs``: the first stage's micro-batches
    (on its rank); ``targets``: the last stage's (on its rank); ``loss_scale``: what each
    micro-batch's loss is multiplied by before its backward (1 / M for the mean); ``kept``: a
    KeptCounter when the schedule counts what each stage keeps (kept.py), else None."""

    def __init__(self, stages: dict, table, loss_fn, inputs, targets, loss_scale: float,
                 kept=None):
        self.stages, self.table, self.loss_fn = stages, table, loss_fn
        self.any_stage = next(iter(stages.values()))
        self.m = table.microbatches
        self.last_stage = table.stages - 1
        self.loss_scale = loss_scale
        self.stream_recv = stream_ordered_receives()
        self.x = {}          # (stage, mb) -> the stage's input (requires grad past stage 0)
        self.y = {}          # (stage, mb) -> the stage's output, until its backward
        self.dy = {}         # (stage, mb) -> the gradient received for that output
        self.scaled = {}     # mb -> the last stage's loss * loss_scale, until its backward
        self.targets = targets
        self.first_inputs = inputs
        self.outputs = [None] * self.m   # the last stage's outputs, detached
        self.losses = [None] * self.m
        self.sending = collections.deque()  # isend requests not known to be complete
        self.live = 0                    # (stage, mb) whose activations are held now
        self.peak = 0
        self.kept = kept
        self.let_go = set()              # (stage, mb) whose output goes once sent
        self.busy = 0.0                  # seconds in this rank's forwards and backwards
        self.spans = []                  # (action, start, end) of each: the dashboard's strip
        self.started = self.ended = None  # the step's perf_counter clock
        self.idle_fraction = None        # of the whole step, once it completed
        self.backwards = collections.Counter()   # stage -> backwards run this step
        self.averaging = [GradAverage(st.submod, i, st.data_group)
                          for i, st in stages.items() if st.data_group is not None]
        self.averaging_of = {a.stage_index: a for a in self.averaging}

    # ---- running ---------------------------------------------------------------------------

    def run(self, program) -> None:
        """Every action of ``program`` in order, then the sends; on a failure, Note [Pipeline
        step failures]."""
        action = None
        self.started = time.perf_counter()
        try:
            for action in program:
                activity.doing(doing, action, self.any_stage.rank_of)
                if action.kind in ("F", "B"):
                    t0 = time.perf_counter()
                    self._do(action)
                    t1 = time.perf_counter()
                    self.busy += t1 - t0
                    self.spans.append((action, t0, t1))  # (converted only when read)
                else:
                    self._do(action)
                # a completed send's tensor is released now, not at the step's end
                while self.sending and self.sending[0].is_completed():
                    self.sending.popleft().wait()
            action = None
            activity.doing(_finishing, self.any_stage.stage_index)
            for request in self.sending:
                request.wait()
            for averaging in self.averaging:
                averaging.wait()
        except Exception as exc:  # noqa: BLE001 - any failure fails the step on every rank
            activity.clear()  # (the error names the action)
            self._fail(action, exc)
        activity.clear()
        self.ended = time.perf_counter()
        self.idle_fraction = max(0.0, 1.0 - self.busy / (self.ended - self.started))

    def _fail(self, action, exc: Exception):
        me = _engine.rank()
        where = describe(action, self.any_stage.rank_of) if action else _FINISHING
        stage = action.stage if action else self.any_stage.stage_index
        named = {me}  # the ranks the message names before the cause
        if action is not None and action.kind in _HAND_OFFS:  # describe's stage
            named.add(self.any_stage.rank_of(action.stage + _HAND_OFFS[action.kind][3]))
        message = (f"pipeline stage {stage} (rank {me}) failed in {where}: "
                   f"{type(exc).__name__}: {exc}"
                   f"{stages_of_ranks_named(str(exc), self.any_stage, named)}")
        try:
            _engine.abort(message)
        except Exception:  # noqa: BLE001, S110 - the world may be gone already; the error stands
            pass
        for request in self.sending:  # the abort failed them: let them release their arrays
            try:
                request.wait()
            except Exception:  # noqa: BLE001, S110
                pass
        for averaging in self.averaging:
            averaging.discard()
        raise PipelineError(message) from exc

    def _do(self, action) -> None:
        s, mb = action.stage, action.microbatch
        kind = action.kind
        if kind == "RECV_F":
            x = self._receive(s, s - 1, forward_tag(s - 1, mb, self.m))
            self.x[s, mb] = x.requires_grad_(torch.is_grad_enabled() and x.is_floating_point())
        elif kind == "RECV_B":
            self.dy[s, mb] = self._receive(s, s + 1, backward_tag(s, mb, self.m))
        elif kind == "SEND_F":
            y = self.y[s, mb] if torch.is_grad_enabled() else self.y.pop((s, mb))
            self._send(y.detach(), s + 1, forward_tag(s, mb, self.m))
            if (s, mb) in self.let_go:
                self.let_go.discard((s, mb))
                self.y[s, mb] = _SentOutput(y)  # Note [Sent outputs]: y's data goes
                if self.kept is not None:
                    self.kept.handed_off(s, mb, y)
        elif kind == "SEND_B":
            x = self.x.pop((s, mb))
            grad = x.grad if x.grad is not None else torch.zeros_like(x)  # output ignores x
            self._send(grad, s - 1, backward_tag(s - 1, mb, self.m))
        elif kind == "F":
            self._forward(s, mb)
        else:
            self._backward(s, mb)

    def _receive(self, s: int, from_stage: int, tag: int) -> torch.Tensor:
        """Stage ``s``'s blocking receive of ``tag`` from ``from_stage``, moved to its device."""
        device = self.stages[s].device
        src = self.any_stage.rank_of(from_stage)
        if device is None:
            return raw_recv_now(src, tag)
        return raw_irecv(src, tag, wait_now=True, device=device,
                         stream_ordered=self.stream_recv).wait()

    def _send(self, tensor: torch.Tensor, to_stage: int, tag: int) -> None:
        self.sending.append(raw_isend(tensor, self.any_stage.rank_of(to_stage), tag))

    def _forward(self, s: int, mb: int) -> None:
        stage = self.stages[s]
        if s == 0:
            x = self.first_inputs[mb]
            if stage.device is not None:
                x = x.to(stage.device)
        elif (s, mb) not in self.x:  # the previous stage is on this rank: a local hand-off
            y = self.y[s - 1, mb] if torch.is_grad_enabled() else self.y.pop((s - 1, mb))
            x = y.detach() if stage.device is None else y.detach().to(stage.device)
            x.requires_grad_(torch.is_grad_enabled() and x.is_floating_point())
            self.x[s, mb] = x
        else:
            x = self.x[s, mb]
        if self.kept is not None and torch.is_grad_enabled():
            y = self.kept.forward(s, mb, stage.forward, x)
        else:
            y = stage.forward(x)
        if s == self.last_stage:
            self.outputs[mb] = y.detach()
            if self.loss_fn is not None:
                target = self.targets[mb]
                loss = self.loss_fn(y, target if stage.device is None else
                                    target.to(stage.device))
                self.losses[mb] = loss.detach()
                self.scaled[mb] = loss * self.loss_scale
        if not torch.is_grad_enabled():  # eval: only outputs still to be sent are kept
            self.x.pop((s, mb), None)
            if s != self.last_stage:
                self.y[s, mb] = y
            return
        self.y[s, mb] = y
        if stage.checkpoint and s != self.last_stage and y.requires_grad and \
                y.untyped_storage().data_ptr() != x.untyped_storage().data_ptr():
            self.let_go.add((s, mb))  # Note [Sent outputs]
        self.live += 1
        self.peak = max(self.peak, self.live)

    def _backward(self, s: int, mb: int) -> None:
        self.backwards[s] += 1
        averaging = self.averaging_of.get(s) if self.backwards[s] == self.m else None
        if averaging is None:
            self._run_backward(s, mb)
            return
        averaging.arm()  # the stage's last backward of the step: its gradients are final
        try:
            self._run_backward(s, mb)
        finally:  # (an interrupt too: no hook outlives the step; _fail waits for the rest)
            averaging.remove_hooks()
        averaging.disarm()

    def _run_backward(self, s: int, mb: int) -> None:
        y = self.y.pop((s, mb))
        if s == self.last_stage:
            self.scaled.pop(mb).backward()
        else:
            dy = self.dy.pop((s, mb), None)
            if dy is None:  # the next stage is on this rank
                x_next = self.x.pop((s + 1, mb))
                dy = x_next.grad if x_next.grad is not None else torch.zeros_like(x_next)
                dy = dy.to(y.device)  # (stages of one rank on two devices)
            if isinstance(y, _SentOutput):
                y.backward(dy)
            elif y.requires_grad:  # (else nothing before it needs a gradient: no parameters)
                torch.autograd.backward(y, grad_tensors=dy)
        self.live -= 1
        if self.kept is not None:
            self.kept.backward(s, mb)


# Note [Sent outputs]
# A stage under checkpoint=True keeps per micro-batch its input (the checkpoint saved it) and
# its output, held by the step only to start the backward from: torch.autograd.backward(y, dy)
# needs y's shape, not its data, and inside the checkpoint nothing saved y (Tanh's saved result
# is recomputed). So once y is handed to its send, the step keeps a 0-dim stand-in instead, an
# autograd Function of y whose backward returns the gradient it is given, and y's data is
# freed when its send completes (the send's alias is the last reference), as Megatron frees a
# sent output's data. That halves what such a stage keeps: its input alone per micro-batch.
# Not done without checkpoint (the stage's own graph may save y: Tanh does, so nothing would
# be freed), on the last stage (the loss holds y), for an output that shares its input's
# storage (nn.Identity, a view: nothing to free), nor where the next stage is on this rank
# (then there is no send: that stage's input is y itself).
class _SentOutput:
    """What the step holds for a sent output: ``backward(dy)`` runs the stage's backward from
    the gradient ``dy`` of that output, as torch.autograd.backward(output, dy) would."""
    __slots__ = ("zero", "box")

    def __init__(self, y: torch.Tensor):
        self.box = [None]  # dy, for the node's backward (not self: no cycle through the graph)
        self.zero = _SeedGradient.apply(y, self.box)  # 0-dim; y's graph hangs below it

    def backward(self, dy: torch.Tensor) -> None:
        self.box[0] = dy
        try:
            self.zero.backward()
        finally:
            self.zero = None
            self.box[0] = None


class _SeedGradient(torch.autograd.Function):
    """A 0-dim output of ``y`` whose backward hands ``y`` the gradient put in ``box``."""

    @staticmethod
    def forward(ctx, y, box):
        ctx.box = box
        ctx.meta = (y.shape, y.device)
        return y.new_zeros(())

    @staticmethod
    def backward(ctx, _grad):
        dy = ctx.box[0]
        shape, device = ctx.meta
        if dy.shape != shape or dy.device != device:  # (a float dtype is cast, as backward's)
            raise RuntimeError(f"the gradient received for the stage's output is "
                               f"{tuple(dy.shape)} on {dy.device}; the output was "
                               f"{tuple(shape)} on {device}")
        return dy, None
