"""The reaper's pid file lives in a folder only this user can enter (issue #35 item 4): its
atomic rewrite goes through a fixed name there, which another user must not be able to place
first (a link in a shared /tmp would redirect the write). The folder goes with close()."""
import json
import os
import stat

import pytest

from hvd_magic import reaper

pytestmark = pytest.mark.timeout(30)


def test_the_pid_file_is_in_a_private_folder_that_close_removes():
    r = reaper.Reaper()
    try:
        mode = stat.S_IMODE(os.stat(r.folder).st_mode)
        assert mode == 0o700, oct(mode)
        assert os.path.dirname(r.path) == r.folder
        r.watch([os.getpid(), 1])
        with open(r.path) as fh:
            assert json.load(fh) == {"pids": sorted([1, os.getpid()])}
        assert not os.path.exists(r.path + ".tmp")
    finally:
        r.close()
    assert not os.path.exists(r.folder)
    assert r.process.poll() is not None  # the watchdog went with it
