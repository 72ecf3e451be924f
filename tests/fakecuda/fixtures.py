"""pytest fixtures for the fake CUDA runtime and NCCL; import them into a test module.

>>> from fakecuda.fixtures import fake_cuda as _fake_cuda  # doctest: +SKIP
>>> fake_cuda = _fake_cuda  # registers the fixture under its name  # doctest: +SKIP
"""
import pytest

from fakecuda.build import FakeCuda, build_fake_cuda


@pytest.fixture(scope="session")
def fake_cuda(tmp_path_factory) -> FakeCuda:
    """The fake ``libcudart.so.12`` and ``libnccl.so.2``, compiled once per test session.

    Every module importing this fixture gets its own fixture definition, so the build goes to
    one folder of the session's base temp directory, where later calls find it.
    """
    return build_fake_cuda(tmp_path_factory.getbasetemp() / "fakecuda")
