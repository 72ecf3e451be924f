"""The digits port of Horovod's PyTorch MNIST example, and unmodified Horovod scripts through
engine_native.compat, on several ranks."""
import os
import subprocess
import sys
import textwrap

import pytest

from .harness import REPO, clean_env, find_mpiexec, run_mpi, run_ranks

pytestmark = pytest.mark.multiproc
EXAMPLE = os.path.join(REPO, 'examples', 'pytorch_digits.py')


@pytest.mark.mpi
def test_digits_example_under_mpiexec():
    proc = subprocess.run([find_mpiexec(), '-n', '2', sys.executable, EXAMPLE, '--epochs', '2',
                           '--log-interval', '5'], cwd=REPO, env=clean_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count('Test set: Average loss') == 2  # rank 0 prints, once per epoch
    assert 'Train Epoch: 2' in proc.stdout


def rank_comm_list():
    import torch
    from mpi4py import MPI

    import engine_native.torch as hvd
    world_rank = MPI.COMM_WORLD.Get_rank()
    if world_rank == 2:
        with pytest.raises(ValueError, match='not in comm'):
            hvd.init(comm=[0, 1])
        return 'outside'
    hvd.init(comm=[1, 0])
    assert (hvd.size(), hvd.rank()) == (2, world_rank)
    total = float(hvd.allreduce(torch.ones(1), op=hvd.Sum))
    hvd.shutdown()
    return total


@pytest.mark.mpi
def test_init_with_a_list_of_ranks_under_mpiexec():
    results = run_mpi(rank_comm_list, 3, timeout=120)
    assert [r.value for r in results] == [2.0, 2.0, 'outside']


def rank_example(epochs):
    import importlib.util
    spec = importlib.util.spec_from_file_location('pytorch_digits', EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    args = example.parser.parse_args(['--epochs', str(epochs), '--log-interval', '100'])
    args.cuda = False
    loss, accuracy = example.train(args)
    import engine_native.torch as hvd
    assert hvd.allgather_object((loss, float(accuracy))) == [(loss, float(accuracy))] * hvd.size()
    hvd.shutdown()
    return loss, float(accuracy)


def test_digits_example_learns():
    results = run_ranks(rank_example, 2, args=(10,), timeout=300)
    loss, accuracy = results[0].value
    assert accuracy > 0.5, (loss, accuracy)


def rank_compat_script(path):
    import runpy
    import engine_native.compat as compat
    compat.install()
    return runpy.run_path(path, run_name='__main__')['RESULT']


def test_unmodified_horovod_script(tmp_path):
    script = tmp_path / 'horovod_script.py'
    script.write_text(textwrap.dedent('''
        import torch
        import horovod.torch as hvd
        from horovod.torch.mpi_ops import Sum

        hvd.init()
        model = torch.nn.Linear(3, 1)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters())
        model(torch.ones(2, 3) * hvd.rank()).sum().backward()
        opt.step()
        RESULT = (hvd.__name__, hvd.size(), float(hvd.allreduce(torch.ones(1), op=Sum)),
                  hvd.allgather_object(model.weight.tolist()))
        hvd.shutdown()
    '''))
    results = run_ranks(rank_compat_script, 2, args=(str(script),), timeout=120)
    name, size, total, weights = results[0].value
    assert (name, size, total) == ('engine_native.torch', 2, 2.0)
    assert weights[0] == weights[1]
