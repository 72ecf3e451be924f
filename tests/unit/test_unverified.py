"""Paths never run on real hardware warn once per process (engine_native.unverified; issue
#39 item 6): once across threads, naming the user's line, not a line of the binding."""
import linecache
import threading
import warnings

import pytest
import torch

from engine_native import unverified
from engine_native.torch import devices, sparse_packed


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(unverified, "_warned", set())


def test_the_first_use_of_a_path_warns_once_from_any_number_of_threads():
    start = threading.Barrier(8)
    said = []

    def use():
        start.wait()
        said.append(unverified.warn("cuda-sparse"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        threads = [threading.Thread(target=use) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        unverified.warn("cuda-p2p-staged")
    assert sorted(said) == [False] * 7 + [True]
    assert [str(w.message).split(";")[0] for w in caught] == [
        unverified.PATHS["cuda-sparse"], unverified.PATHS["cuda-p2p-staged"]]
    assert all(w.category is RuntimeWarning and "not yet been verified on a GPU"
               in str(w.message) for w in caught)


def test_a_sparse_gradient_on_a_device_warns_at_the_user_s_line(monkeypatch):
    grad = torch.sparse_coo_tensor([[0, 2]], [1.0, 2.0], (4,), check_invariants=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sparse_packed._pack([grad])  # on the CPU: no warning
        monkeypatch.setattr(devices, "placement", lambda t: (0, 0))  # as a CUDA tensor
        sparse_packed._pack([grad])  # the first device use: the warning names this line
        sparse_packed._pack([grad])
    assert [w.filename for w in caught] == [__file__]
    assert "the first device use" in linecache.getline(__file__, caught[0].lineno)
    assert str(caught[0].message).startswith(unverified.PATHS["cuda-sparse"])
