"""engine_native.basics and the core it ships with: a core that lacks one of the functions the
package calls is an import-time error naming the function and the fix, never a silent no-op."""
import contextlib
import importlib
import importlib.util
import pathlib
import sys

import pytest

_spec = importlib.util.spec_from_file_location(
    'torch_fakecore', pathlib.Path(__file__).with_name('test_torch_fakecore.py'))
_fakecore = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fakecore)


@contextlib.contextmanager
def _core_without(name=None):
    """``engine_native`` imported afresh on a fake core that lacks ``name`` (or nothing)."""
    saved = {k: v for k, v in sys.modules.items()
             if k == 'engine_native' or k.startswith('engine_native.')}
    for k in saved:
        del sys.modules[k]
    core = _fakecore.make_fake_core()
    if name is not None:
        delattr(core, name)
    sys.modules['engine_native._core'] = core
    try:
        yield
    finally:
        for k in [k for k in sys.modules if k == 'engine_native' or
                  k.startswith('engine_native.')]:
            del sys.modules[k]
        sys.modules.update(saved)


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
