"""hvd.elastic worker-side API at size 1 on the fake core: state commit/restore/sync, the
run decorator's retry, ElasticSampler bookkeeping."""
import torch


def test_torch_state_commit_restore(hvd):
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state = hvd.elastic.TorchState(model=model, optimizer=opt, epoch=3, names=['a'])
    assert state.model is model and state.epoch == 3
    state.commit()
    with torch.no_grad():
        model.weight.add_(1.0)
    saved = model.weight.detach().clone()
    state.epoch = 7
    state.names.append('b')
    state.restore()
    assert state.epoch == 3 and state.names == ['a']
    assert not torch.equal(model.weight, saved)
    state.sync()
    assert state.epoch == 3


def test_run_retries_after_internal_error(hvd):
    state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, counter=0)
    calls, resets = [], []
    state.register_reset_callbacks([lambda: resets.append(hvd.is_initialized())])

    @hvd.elastic.run
    def train(state, limit):
        calls.append(state.counter)
        state.counter += 1
        if len(calls) < limit:
            raise hvd.HorovodInternalError('peer lost')
        return 'done'

    assert train(state, 3) == 'done'
    assert calls == [0, 0, 0]  # restored to the last commit each time
    assert resets == [True, True] and hvd.is_initialized()


def test_hosts_updated_interrupt_skips_restore(hvd):
    state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, step=0)
    seen = []

    @hvd.elastic.run
    def train(state):
        seen.append(state.step)
        state.step += 1
        state.on_hosts_updated(1, 'added')
        if len(seen) == 1:
            state.commit()  # raises HostsUpdatedInterrupt (no restore)
        return state.step

    assert train(state) == 2 and seen == [0, 1]


def test_elastic_sampler(hvd):
    data = list(range(10))
    sampler = hvd.elastic.ElasticSampler(data, shuffle=False)
    assert len(sampler) == 10 and list(iter(sampler)) == data
    sampler.record_batch(0, 4)
    assert sampler.processed_indices == {0, 1, 2, 3}
    state = sampler.state_dict()
    other = hvd.elastic.ElasticSampler(data, shuffle=True, seed=1)
    other.load_state_dict(state)
    assert sorted(iter(other)) == list(range(4, 10))
    other.set_epoch(1)
    assert len(other) == 10
