"""hvd.elastic on real ranks: a failed collective (an abort on one rank) makes every rank
restore its last commit, re-initialize in the same processes and carry on."""
import pytest
import torch

from .harness import run_ranks

pytestmark = pytest.mark.multiproc


def rank_elastic_recovery():
    import engine_native.torch as hvd
    from engine_native import basics

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    torch.manual_seed(r)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0, seen=[])
    resets = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])
    attempts = []

    @hvd.elastic.run
    def train(state):
        attempts.append(state.step)
        while state.step < 4:
            if state.step == 2 and len(attempts) == 1 and r == n - 1:
                basics.abort('simulated failure on rank %d' % r)
            total = hvd.allreduce(torch.ones(1), name='s%d' % state.step, op=hvd.Sum)
            state.seen.append(float(total))
            state.step += 1
            if state.step % 2 == 0:
                state.commit()
        return state.step

    assert train(state) == 4
    assert attempts == [0, 2], attempts          # restarted from the commit at step 2
    assert resets == [n]                         # one reset, same size
    assert state.seen == [float(n)] * 4          # no step counted twice
    weights = hvd.allgather_object(model.weight.tolist())
    assert all(w == weights[0] for w in weights)  # state.sync() after the reset
    hvd.shutdown()


@pytest.mark.parametrize('np', [2, 3])
def test_elastic_recovers_from_abort(np):
    run_ranks(rank_elastic_recovery, np, timeout=120)
