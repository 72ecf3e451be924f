"""Source checkouts: this checkout's ``widgets/`` and ``kernel/`` as ``hvd_magic.widgets`` and
``hvd_magic.kernel``.

setup.py maps those folders under ``hvd_magic`` when the package is installed. Engines of a
checkout get ``PYTHONPATH=<checkout>`` (ranksetup.engine_env), so ``hvd_magic`` comes from the
checkout; without this finder its ``widgets`` would come from whatever hvd-magic is installed
(another checkout's editable install), or be missing. Only those two names are mapped: the rest
of the checkout (tests, setup.py) never becomes a submodule. Installed copies are untouched.
"""

import importlib.abc
import importlib.util
import os
import sys

MAPPED = ("widgets", "kernel")


class CheckoutFinder(importlib.abc.MetaPathFinder):
    """Finds ``hvd_magic.<name>`` for ``name`` in MAPPED in ``root``/<name>."""

    def __init__(self, root: str):
        self.root = root

    def find_spec(self, fullname, path=None, target=None):
        parent, _, name = fullname.rpartition(".")
        if parent != "hvd_magic" or name not in MAPPED:
            return None
        folder = os.path.join(self.root, name)
        return importlib.util.spec_from_file_location(
            fullname, os.path.join(folder, "__init__.py"), submodule_search_locations=[folder])


def install(package_dir: str) -> None:
    """Put the finder first on ``sys.meta_path`` when ``package_dir`` (hvd_magic's folder)
    sits in a source checkout; idempotent."""
    root = os.path.dirname(os.path.abspath(package_dir))
    if not os.path.isfile(os.path.join(root, "setup.py")) or not all(
            os.path.isfile(os.path.join(root, name, "__init__.py")) for name in MAPPED):
        return
    if not any(isinstance(f, CheckoutFinder) and f.root == root for f in sys.meta_path):
        sys.meta_path.insert(0, CheckoutFinder(root))
