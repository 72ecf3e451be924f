"""engine_native.compat: the ``horovod`` import alias and the ``run`` entry point."""
import importlib
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def compat(fake):
    saved = {k: v for k, v in sys.modules.items() if k == 'horovod' or k.startswith('horovod.')}
    for k in saved:
        del sys.modules[k]
    module = importlib.import_module('engine_native.compat')
    module.install()
    try:
        yield module, fake[0]
    finally:
        module.uninstall()
        sys.modules.update(saved)


def test_alias_resolves_to_the_same_modules(compat):
    compat_mod, hvd = compat
    import horovod
    import horovod.torch as alias
    from horovod.common.exceptions import HorovodInternalError
    from horovod.torch.mpi_ops import Sum
    from horovod.torch.elastic import TorchState
    import horovod.torch.optimizer
    assert alias is hvd and alias.__spec__.name == 'engine_native.torch'
    assert horovod.__version__.startswith('0.28')
    assert HorovodInternalError is hvd.HorovodInternalError and Sum == 1
    assert TorchState is hvd.elastic.TorchState
    assert horovod.torch.optimizer is sys.modules['engine_native.torch.optimizer']
    with pytest.raises(AttributeError, match='hvd_magic.run'):
        horovod.run
    with pytest.raises(ImportError):
        import horovod.tensorflow  # noqa: F401
    assert compat_mod.is_installed()
    compat_mod.install()  # idempotent
    assert sys.meta_path.count(compat_mod._finder) == 1


def test_uninstall_forgets_aliases(compat):
    compat_mod, _ = compat
    import horovod.torch  # noqa: F401
    compat_mod.uninstall()
    assert 'horovod' not in sys.modules and 'horovod.torch' not in sys.modules
    assert not compat_mod.is_installed()
    assert 'engine_native.torch' in sys.modules


def test_usage_without_arguments(fake):
    compat = importlib.import_module('engine_native.compat')
    assert compat.main(['--help']) == 0
    assert compat.main([]) == 2


def test_run_unmodified_script(tmp_path):
    script = tmp_path / 'train.py'
    script.write_text(textwrap.dedent('''
        import sys
        import torch
        import horovod.torch as hvd
        hvd.init()
        out = hvd.allreduce(torch.ones(3), name='x')
        print('OK', hvd.__name__, hvd.size(), out.tolist(), sys.argv[1:], __name__)
        hvd.shutdown()
    '''))
    env = {k: v for k, v in os.environ.items() if not k.startswith(('HVD_', 'HOROVOD_',
                                                                    'OMPI_', 'PMI'))}
    env['PYTHONPATH'] = str(REPO)
    proc = subprocess.run([sys.executable, '-m', 'engine_native.compat', 'run', str(script),
                           '--flag', '1'], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "OK engine_native.torch 1 [1.0, 1.0, 1.0] ['--flag', '1'] __main__" in proc.stdout
