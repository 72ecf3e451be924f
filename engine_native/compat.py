"""Run unmodified Horovod scripts on engine_native: ``import horovod.torch as hvd`` resolves to
``engine_native.torch``.

Two ways in:

- From Python, before the script's imports run::

      import engine_native.compat
      engine_native.compat.install()
      import horovod.torch as hvd          # -> engine_native.torch

- From the command line, for a script that must not be edited::

      python -m engine_native.compat run train.py --epochs 2
      python -m engine_native.compat run -m mypackage.train --epochs 2
      hvdrun -np 4 python -m engine_native.compat run train.py

``install()`` adds a meta-path finder (first in ``sys.meta_path``, so it wins over an installed
Horovod) that maps ``horovod.torch[.*]`` to ``engine_native.torch[.*]`` (the very same module
objects, loaded lazily: installing the alias imports neither torch nor the core), and provides
small ``horovod`` and ``horovod.common.exceptions`` modules. ``horovod.run`` is not aliased:
use ``hvd_magic.run`` (engine_native never imports the launcher side).
"""
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import runpy
import sys
import types

HOROVOD_VERSION = '0.28.1+engine_native'

# Alias prefix -> real prefix. Submodules map by prefix (horovod.torch.mpi_ops -> ...).
_PREFIXES = {'horovod.torch': 'engine_native.torch'}


def _synthetic_horovod():
    module = types.ModuleType('horovod', 'Horovod alias provided by engine_native.compat.')
    module.__version__ = HOROVOD_VERSION
    module.__path__ = []

    def __getattr__(name):
        if name == 'run':
            raise AttributeError(
                "horovod.run is not provided by engine_native.compat; use hvd_magic.run(fn, "
                "np=N) or launch the script with hvdrun -np N")
        raise AttributeError("module 'horovod' has no attribute %r" % name)
    module.__getattr__ = __getattr__
    return module


def _synthetic_common():
    module = types.ModuleType('horovod.common', 'Horovod alias provided by engine_native.compat.')
    module.__path__ = []
    return module


def _synthetic_exceptions():
    from engine_native.torch.elastic.state import HostsUpdatedInterrupt
    from engine_native.torch.runtime import HorovodInternalError
    module = types.ModuleType('horovod.common.exceptions')
    module.HorovodInternalError = HorovodInternalError
    module.HostsUpdatedInterrupt = HostsUpdatedInterrupt
    return module


_SYNTHETIC = {
    'horovod': _synthetic_horovod,
    'horovod.common': _synthetic_common,
    'horovod.common.exceptions': _synthetic_exceptions,
}


def _target(fullname):
    for alias, real in _PREFIXES.items():
        if fullname == alias or fullname.startswith(alias + '.'):
            return real + fullname[len(alias):]
    return None


class _AliasLoader(importlib.abc.Loader):
    """Hands out the real module object; keeps its own ``__spec__`` intact."""

    def __init__(self, fullname):
        self.fullname = fullname

    def create_module(self, spec):
        factory = _SYNTHETIC.get(self.fullname)
        if factory is not None:
            return factory()
        module = importlib.import_module(_target(self.fullname))
        self._real_spec = module.__spec__
        return module

    def exec_module(self, module):
        real_spec = getattr(self, '_real_spec', None)
        if real_spec is not None:
            module.__spec__ = real_spec  # module_from_spec overwrote it with the alias spec


class HorovodAliasFinder(importlib.abc.MetaPathFinder):
    """Resolves ``horovod``, ``horovod.common.exceptions`` and ``horovod.torch[.*]``."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in _SYNTHETIC:
            is_package = fullname in ('horovod', 'horovod.common')
            return importlib.machinery.ModuleSpec(fullname, _AliasLoader(fullname),
                                                  is_package=is_package)
        real = _target(fullname)
        if real is None:
            return None
        try:
            real_spec = importlib.util.find_spec(real)
        except (ImportError, ValueError):
            real_spec = None
        if real_spec is None:
            return None
        return importlib.machinery.ModuleSpec(
            fullname, _AliasLoader(fullname),
            is_package=real_spec.submodule_search_locations is not None)


_finder = HorovodAliasFinder()


def is_installed():
    """True when the alias finder is active."""
    return _finder in sys.meta_path


def install():
    """Make ``import horovod.torch`` (and ``import horovod``) resolve to engine_native.

    Raises
    ------
    RuntimeError
        A real ``horovod`` package was already imported in this process; install the alias
        before the script's imports (or use ``python -m engine_native.compat run``).
    """
    loaded = sys.modules.get('horovod')
    if loaded is not None and getattr(loaded, '__version__', None) != HOROVOD_VERSION:
        raise RuntimeError('engine_native.compat.install(): the real horovod package is already '
                           'imported; call install() before `import horovod`')
    if not is_installed():
        sys.meta_path.insert(0, _finder)


def uninstall():
    """Remove the alias and forget the ``horovod*`` modules it provided."""
    if is_installed():
        sys.meta_path.remove(_finder)
    for name in [n for n in sys.modules if n == 'horovod' or n.startswith('horovod.')]:
        module = sys.modules[name]
        if isinstance(getattr(module, '__loader__', None), _AliasLoader) or \
                getattr(module, '__name__', '').startswith('engine_native') or \
                getattr(module, '__version__', None) == HOROVOD_VERSION:
            del sys.modules[name]


_USAGE = """usage: python -m engine_native.compat run SCRIPT.py [ARGS...]
       python -m engine_native.compat run -m MODULE [ARGS...]

Runs an unmodified Horovod PyTorch script with `import horovod.torch` resolved to
engine_native.torch."""


def main(argv=None):
    """Command-line entry point; returns an exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == 'run':
        argv = argv[1:]
    if not argv or argv[0] in ('-h', '--help'):
        print(_USAGE)
        return 0 if argv else 2
    install()
    if argv[0] == '-m':
        if len(argv) < 2:
            print(_USAGE, file=sys.stderr)
            return 2
        sys.argv = [argv[1]] + argv[2:]
        runpy.run_module(argv[1], run_name='__main__', alter_sys=True)
    else:
        sys.argv = argv
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name='__main__')
    return 0


if __name__ == '__main__':
    sys.exit(main())
