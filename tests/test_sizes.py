"""File sizes stay within the limits of shared/STYLE.md: a Python file (module or test) is never
over 400 lines, its target, which every one now meets; a C++ .cc never over 600, a header never
over 300 (their hard limits; the targets are 400 and 200)."""
import os
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIMITS = {".py": 400, ".cc": 600, ".cpp": 600, ".h": 300, ".hpp": 300}


def _sources():
    """The project's files as git sees them (tracked, or new and not ignored); without git,
    a walk that skips hidden folders, virtual environments and build outputs."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                             cwd=REPO, capture_output=True, text=True, timeout=60, check=True)
        files = out.stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        files = []
        for dirpath, dirnames, names in os.walk(REPO):
            dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "build"
                           and not d.endswith(".egg-info")
                           and not os.path.exists(os.path.join(dirpath, d, "pyvenv.cfg"))]
            files += [os.path.relpath(os.path.join(dirpath, n), REPO) for n in names]
    for rel in files:
        path = os.path.join(REPO, rel)
        if os.path.splitext(rel)[1] in LIMITS and os.path.isfile(path):
            yield path


def test_no_file_over_the_hard_size_limit():
    over = []
    for path in _sources():
        with open(path, errors="replace") as fh:
            lines = sum(1 for _ in fh)
        limit = LIMITS[os.path.splitext(path)[1]]
        if lines > limit:
            over.append(f"{os.path.relpath(path, REPO)}: {lines} lines (limit {limit})")
    if over:
        pytest.fail("split these by responsibility (shared/STYLE.md):\n" + "\n".join(over))
