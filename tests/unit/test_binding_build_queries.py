"""Horovod's build and MPI queries (gloo_built, nccl_built, mpi_enabled, ...) are exported by
every binding, as horovod.torch, horovod.tensorflow and horovod.tensorflow.keras export them,
and are one copy: the same functions, with the same answers, whichever binding is imported."""
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.jax, pytest.mark.keras, pytest.mark.tensorflow]

_SCRIPT = r"""
import engine_native.build_info as info
import engine_native.jax, engine_native.keras, engine_native.tensorflow, engine_native.torch
names = '''gloo_enabled gloo_built nccl_built ddl_built ccl_built cuda_built rocm_built
mpi_enabled mpi_built mpi_threads_supported'''.split()
for binding in (engine_native.jax, engine_native.keras, engine_native.tensorflow,
                engine_native.torch):
    missing = [n for n in names if not hasattr(binding, n)]
    assert not missing, (binding.__name__, missing)
    for name in ('gloo_enabled', 'gloo_built', 'nccl_built', 'ddl_built', 'ccl_built',
                 'cuda_built', 'rocm_built'):
        assert getattr(binding, name) is getattr(info, name), (binding.__name__, name)
assert info.gloo_built() is False and info.gloo_enabled() is False
assert isinstance(info.nccl_built(), int) and isinstance(info.cuda_built(), bool)
print('ok')
"""


def test_every_binding_exports_horovod_s_build_queries_once():
    env = dict(os.environ, KERAS_BACKEND="torch", TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
