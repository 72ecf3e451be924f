"""hvd_magic.launch.shm_sweep: after an MPICH job that did not end cleanly, the MPICH files it
left on this host go; a live job's (mapped), an older one, or another name stay."""
import mmap
import os
import time

from hvd_magic.launch.shm_sweep import PREFIX, sweep_mpich_files


def _make(folder, name, mtime=None):
    path = os.path.join(folder, name)
    with open(path, "wb") as fh:
        fh.write(b"\0" * 4096)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def test_only_a_new_unmapped_mpich_file_is_removed(tmp_path):
    folder = str(tmp_path)
    since = time.time() - 1
    dead = _make(folder, PREFIX + "dead_0")
    older = _make(folder, PREFIX + "older_0", mtime=since - 60)
    other = _make(folder, "hvd-segment")
    live = _make(folder, PREFIX + "live_0")
    with open(live, "r+b") as fh, mmap.mmap(fh.fileno(), 4096) as mapping:
        removed = sweep_mpich_files(since, folder)
        assert mapping[0] == 0  # still mapped during the sweep
    assert removed == [dead]
    assert not os.path.exists(dead)
    for kept in (older, other, live):
        assert os.path.exists(kept), kept


def test_nothing_to_sweep_is_cheap_and_silent(tmp_path):
    assert sweep_mpich_files(time.time(), str(tmp_path)) == []
    assert sweep_mpich_files(time.time(), str(tmp_path / "missing")) == []
