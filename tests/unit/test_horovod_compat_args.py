"""Horovod's argument conventions shared by the bindings (engine_native.horovod_args): the
deprecated average= beside op=, and init's comm / process_sets."""
import warnings

import pytest

from engine_native._dtypes import Average, Max, Sum
from engine_native.horovod_args import init_arguments, resolve_op


def allreduce(op=None, average=None):  # a binding's public function: the warning names its caller
    return resolve_op(op, average)


def test_op_wins_and_neither_means_average():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert allreduce() == Average
        assert allreduce(op=Max) == Max


def test_average_is_deprecated_and_maps_to_average_or_sum():
    with pytest.warns(DeprecationWarning, match="replaced with `op`") as caught:
        assert allreduce(average=True) == Average
    assert caught[0].filename == __file__  # points at the user's call, not at the binding
    with pytest.warns(DeprecationWarning):
        assert allreduce(average=False) == Sum


def test_op_and_average_together_is_an_error():
    with pytest.raises(ValueError, match="supersedes average"):
        allreduce(op=Sum, average=True)


def test_init_arguments():
    assert init_arguments(None, "dynamic") == (None, None)
    sets = [object()]
    assert init_arguments(None, sets) == (None, sets)
    with pytest.raises(ValueError, match='"dynamic"'):
        init_arguments(None, "static")
