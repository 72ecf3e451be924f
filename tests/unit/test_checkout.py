"""hvd_magic.checkout: a source checkout maps exactly its widgets/ and kernel/ folders under
hvd_magic (as setup.py's package_dir does when installed), nothing else."""

import os
import subprocess
import sys

from hvd_magic.checkout import CheckoutFinder, install

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_finder_maps_only_the_two_folders(tmp_path):
    for name in ("widgets", "kernel", "tests"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("")
    finder = CheckoutFinder(str(tmp_path))
    spec = finder.find_spec("hvd_magic.widgets")
    assert spec.origin == str(tmp_path / "widgets" / "__init__.py")
    assert spec.submodule_search_locations == [str(tmp_path / "widgets")]
    assert finder.find_spec("hvd_magic.kernel").origin == str(tmp_path / "kernel" / "__init__.py")
    for other in ("hvd_magic.tests", "widgets", "hvd_magic.widgets.view", "other.widgets"):
        assert finder.find_spec(other) is None, other


def test_install_only_in_a_checkout_and_once(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    before = len(sys.meta_path)
    install(str(tmp_path / "hvd_magic"))  # no setup.py there: an installed copy
    assert len(sys.meta_path) == before
    install(os.path.join(REPO, "hvd_magic"))
    install(os.path.join(REPO, "hvd_magic"))
    finders = [f for f in sys.meta_path if isinstance(f, CheckoutFinder) and f.root == REPO]
    assert len(finders) == 1


def test_a_checkout_on_pythonpath_imports_its_own_widgets(tmp_path):
    code = ("import hvd_magic.widgets as w, hvd_magic.widgets.publisher as p\n"
            "print(w.__file__, p.__file__)\n"
            "try:\n    import hvd_magic.tests\nexcept ImportError:\n    print('no tests')\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHONPATH": REPO})
    assert out.returncode == 0, out.stderr
    widgets, publisher, *rest = out.stdout.split()
    assert widgets == os.path.join(REPO, "widgets", "__init__.py")
    assert publisher == os.path.join(REPO, "widgets", "publisher.py")
    assert " ".join(rest) == "no tests"
