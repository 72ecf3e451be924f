"""engine_native.basics and the core it ships with: a core that lacks one of the functions the
package calls is an import-time error naming the function and the fix, never a silent no-op."""
import contextlib
import importlib

import pytest
from fakecore import engine_native_on, make_fake_core


@contextlib.contextmanager
def _core_without(name=None):
    """``engine_native`` imported afresh on a fake core that lacks ``name`` (or nothing)."""
    core = make_fake_core()
    if name is not None:
        delattr(core, name)
    with engine_native_on(core):
        yield


@pytest.mark.parametrize('name', ['start_timeline', 'stop_timeline', 'timeline_events',
                                  'autotune_state', 'set_autotune'])
def test_a_core_without_a_timeline_or_autotune_function_fails_the_import(name):
    with _core_without(name), pytest.raises(ImportError) as info:
        importlib.import_module('engine_native.basics')
    assert name in str(info.value)
    assert 'rebuild it from this checkout' in str(info.value)


def test_the_fake_core_has_everything_basics_calls():
    """The control for the test above: the same fake, complete, imports."""
    with _core_without():
        basics = importlib.import_module('engine_native.basics')
    assert callable(basics.start_timeline)
