"""hvd_magic.ssh_engines: what ``%hvd_start --launcher ssh --hosts`` hands ipyparallel, and
the errors that say what to write (the real launch: tests/multihost/test_hvd_start_ssh.py)."""
import sys

import pytest

from hvd_magic import ssh_engines
from hvd_magic.errors import StartError


def test_hosts_fill_in_order_and_config_has_this_python():
    slots = ssh_engines.parse("a:2,b:2,c:4", 5, "ssh")
    assert [s.host for s in slots] == ["a", "a", "b", "b", "c"]
    cfg = ssh_engines.config(slots)
    assert cfg.SSHEngineSetLauncher.engines == {"a": 2, "b": 2, "c": 1}
    assert cfg.SSHEngineSetLauncher.remote_python == sys.executable


def test_rank_order_follows_the_host_list_then_registration():
    slots = ssh_engines.parse("a:2,b:2", 4, "ssh")
    by_engine = {0: {"host": "b"}, 1: {"host": "a"}, 2: {"host": "b"}, 3: {"host": "a"}}
    assert ssh_engines.rank_order([0, 1, 2, 3], by_engine, slots) == [1, 3, 0, 2]
    by_engine[3] = {"host": "elsewhere"}  # an engine on a host not in the list goes last
    assert ssh_engines.rank_order([0, 1, 2, 3], by_engine, slots) == [1, 0, 2, 3]


@pytest.mark.parametrize("spec, n, launcher, message", [
    (None, 4, "ssh", "--launcher ssh needs the hosts and their slots"),
    ("a:2,b:2", 4, "local", "--hosts is for --launcher ssh (got --launcher local)"),
    ("a:2,b:1", 4, "ssh", "-np 4 needs 4 slots"),
    ("a:x", 1, "ssh", "expected host:slots"),
])
def test_bad_host_lists_say_what_to_write(spec, n, launcher, message):
    with pytest.raises(StartError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ssh_engines.parse(spec, n, launcher)


def test_other_launchers_without_hosts_are_untouched():
    assert ssh_engines.parse(None, 4, "mpi") is None
