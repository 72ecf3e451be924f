"""``python -m hvd_magic.doctor`` prints what a problem report needs, and a missing or broken
piece becomes a line of the report (with the fix), never a traceback that hides the rest."""
import os
import subprocess
import sys

import engine_native
import hvd_magic
from engine_native import _core
from hvd_magic import doctor

SECTIONS = ("[versions]", "[install]", "[MPI]", "[CUDA]", "[transports]", "[GPUs]",
            "[environment]")


def test_the_report_names_versions_the_build_and_what_loads(tmp_path):
    # the hvd_magic this test imported (a checkout, or an installed wheel), from elsewhere
    where = os.path.dirname(os.path.dirname(os.path.abspath(hvd_magic.__file__)))
    env = dict(os.environ, PYTHONPATH=where, HVD_SECRET="do-not-print-me")
    done = subprocess.run([sys.executable, "-m", "hvd_magic.doctor"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert [line for line in out.splitlines() if line.startswith("[")] == list(SECTIONS)
    assert f"hvd-magic {engine_native.__version__}" in out
    assert f"core {_core.__file__}" in out
    assert ("test switches: compiled in" if _core.TEST_SWITCHES else
            "test switches: none") in out
    assert "core built by " in out and "core built by unknown" not in out
    for piece in ("NCCL", "CUDA runtime", "CUDA driver", "NVRTC", "MPS:", "CPU tensors: shm"):
        assert piece in out, piece
    assert "HVD_SECRET=<hidden>" in out and "do-not-print-me" not in out
    assert "could not check" not in out, out


def test_one_version_for_both_packages():
    from engine_native._version import __version__

    assert hvd_magic.__version__ == engine_native.__version__ == __version__


def test_a_missing_or_broken_piece_is_reported_not_raised(monkeypatch, tmp_path):
    def broken():
        raise OSError("libsomething.so: cannot open shared object file")

    monkeypatch.setattr(doctor, "SECTIONS", (("CUDA", broken), ("MPI", doctor.mpi),
                                             ("environment", doctor.environment)))
    monkeypatch.setenv("PATH", str(tmp_path))  # no mpiexec anywhere
    text = doctor.report()
    assert "[CUDA]\n  could not check: OSError: libsomething.so: cannot open" in text
    assert "mpiexec: not on PATH" in text
    assert "the MPI launcher cannot start ranks" in text and "Fix:" in text
    assert "\n[environment]\n" in text  # the sections after the broken one still ran
