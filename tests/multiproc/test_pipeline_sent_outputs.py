"""A stage under ``checkpoint=True`` lets go of each output once it is sent (Note [Sent
outputs] in engine_native/torch/pipelining/step_run.py): at stage 0's first backward of a GPipe
step, none of the M outputs it sent is alive any more (without re-materialisation all M are,
saved by the stage's last Tanh), the step's gradients still equal those of single-process
gradient accumulation, and ``count_kept`` counts the input alone per micro-batch held."""
from multiproc.harness import run_ranks

M = 4


def sent_outputs_suite():
    import gc
    import weakref

    import torch

    import engine_native.torch as hvd
    from engine_native.torch.pipelining import PipelineStage, ScheduleGPipe

    hvd.init()
    r, k = hvd.rank(), hvd.size()
    torch.manual_seed(0)
    full = torch.nn.Sequential(*[m for _ in range(k) for m in
                                 (torch.nn.Linear(6, 6, dtype=torch.float64), torch.nn.Tanh())])
    x = torch.randn(8, 6, dtype=torch.float64)
    y = torch.randn(8, 6, dtype=torch.float64)
    mse = torch.nn.functional.mse_loss
    want = {}
    for xm, ym in zip(torch.tensor_split(x, M), torch.tensor_split(y, M)):
        (mse(full(xm), ym) / M).backward()
    for p in full.parameters():
        want[p] = p.grad.clone()
    full.zero_grad()

    class Watched(torch.nn.Module):
        """The stage's layers; records each forward's output, and when the gradient of the
        first one arrives (the step's first backward) how many of them are still alive."""

        def __init__(self, inner):
            super().__init__()
            self.inner, self.outputs, self.alive_at_backward = inner, [], None

        def forward(self, inp):
            out = self.inner(inp)
            if len(self.outputs) < M and torch.is_grad_enabled():  # (not the recomputes)
                self.outputs.append(weakref.ref(out))
                out.register_hook(self.count)  # (kept by the graph, not by the tensor)
            return out

        def count(self, grad):
            if self.alive_at_backward is None:
                gc.collect()
                self.alive_at_backward = sum(ref() is not None for ref in self.outputs)

    found = {}
    for checkpoint in (False, True):
        watched = Watched(full[2 * r:2 * r + 2])
        stage = PipelineStage(watched, r, k, checkpoint=checkpoint)
        schedule = ScheduleGPipe(stage, M, loss_fn=mse)
        schedule.count_kept = True
        schedule.step(*([x] if r == 0 else []), **({"target": y} if r == k - 1 else {}))
        rel = max(((p.grad - want[p]).abs().max() / want[p].abs().max()).item()
                  for p in watched.parameters())
        watched.zero_grad()
        kept = schedule.peak_kept[r]
        found[checkpoint] = (watched.alive_at_backward, rel, kept.tensors, kept.bytes)
    hvd.shutdown()
    return found


def test_a_checkpointed_stage_lets_go_of_its_sent_outputs():
    for res in run_ranks(sent_outputs_suite, 2, timeout=120):
        found = res.value
        alive, rel, tensors, nbytes = found[True]
        assert rel <= 1e-6, found
        # 2 x 6 float64 per micro-batch tensor: 96 bytes
        if res.rank == 0:  # sends its outputs: M inputs, and the newest output until its send
            assert alive == 0, found
            assert (tensors, nbytes) == (M + 1, 96 * (M + 1)), found
        else:  # the last stage: the loss holds each output
            assert alive == M, found
            assert (tensors, nbytes) == (2 * M, 96 * 2 * M), found
        alive, rel, tensors, nbytes = found[False]
        assert rel <= 1e-6, found
        assert alive == M, found  # without checkpoint the last Tanh saved every output
        assert tensors == 2 * M, found  # (Linear saved the input, Tanh the output)
