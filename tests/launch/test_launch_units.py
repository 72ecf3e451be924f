"""Launcher pieces on their own: host lists, flag translation, mpiexec command lines, output
lines, rankwrap and remote workers (the process supervisor's rules: test_process_job.py)."""
import io
import os
import shlex
import subprocess
import sys

import pytest

from hvd_magic.launch import config, hosts, hvdrun
from hvd_magic.launch.mpi import build_command
from hvd_magic.launch.output import LineSplitter, RankOutput, parse_tagged, traceback_tail


# -- host lists -----------------------------------------------------------------------------


def test_parse_hosts_and_assign():
    hl = hosts.parse_hosts("a:2, b:1,c")
    assert [(h.name, h.slots) for h in hl] == [("a", 2), ("b", 1), ("c", 1)]
    slots = hosts.assign(4, hl)
    assert [(s.host, s.local_rank, s.local_size, s.cross_rank, s.cross_size) for s in slots] == [
        ("a", 0, 2, 0, 3), ("a", 1, 2, 0, 1), ("b", 0, 1, 1, 3), ("c", 0, 1, 2, 3)]
    assert [s.host for s in hosts.assign(2, None)] == ["localhost", "localhost"]
    for bad in ("a:0", "a:x", "", "a:1,a:2"):
        with pytest.raises(ValueError):
            hosts.parse_hosts(bad)
    with pytest.raises(ValueError, match="needs 5 slots"):
        hosts.assign(5, hl)


def test_hostfile(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# cluster\nnode1 slots=4\nnode2:2  # comment\nnode3\n")
    assert [(h.name, h.slots) for h in hosts.read_hostfile(str(path))] == [
        ("node1", 4), ("node2", 2), ("node3", 1)]


def test_slots_of_spark_placement_matches_core_bootstrap():
    slots = hosts.slots_of(["a", "b", "b", "a"])
    assert [(s.local_rank, s.local_size, s.cross_rank, s.cross_size) for s in slots] == [
        (0, 2, 0, 2), (0, 2, 1, 2), (1, 2, 0, 2), (1, 2, 1, 2)]


def test_local_hosts():
    assert hosts.is_local("localhost") and hosts.is_local("127.0.0.1")
    assert hosts.is_local(__import__("socket").gethostname())
    assert not hosts.is_local("no-such-host.invalid")
    assert hosts.only_loopback(hosts.parse_hosts("localhost:2,127.0.0.1:1"))


# -- environment ------------------------------------------------------------------------------

def test_tunables_become_hvd_variables(tmp_path):
    env = config.tunables_env(fusion_threshold_mb=64, cycle_time_ms=0.5, cache_capacity=0,
                              hierarchical_allreduce=True, timeline_filename="tl.json",
                              autotune=True, log_level="FATAL", tcp=True, start_timeout=30,
                              no_stall_check=True, stall_check_shutdown_time_seconds=120,
                              bind_to="core")
    assert env == {"HVD_CPU_BIND": "core", "HVD_FUSION_THRESHOLD": str(64 << 20),
                   "HVD_CYCLE_TIME_MS": "0.5", "HVD_CACHE_CAPACITY": "0", "HVD_HIERARCHICAL_ALLREDUCE": "1",
                   "HVD_TIMELINE": os.path.abspath("tl.json"), "HVD_AUTOTUNE": "1",
                   "HVD_LOG": "error", "HVD_TRANSPORT": "tcp", "HVD_START_TIMEOUT": "30",
                   "HVD_STALL_CHECK_DISABLE": "1", "HVD_STALL_SHUTDOWN_TIME": "120"}
    with pytest.raises(ValueError, match="--log-level"):
        config.tunables_env(log_level="loud")
    assert config.parse_env_pairs(["A=1", "B=x=y"]) == {"A": "1", "B": "x=y"}
    with pytest.raises(ValueError):
        config.parse_env_pairs(["novalue"])


def test_clean_env_drops_inherited_ranks():
    env = config.clean_env({"PMI_RANK": "3", "HVD_RANK": "1", "OMPI_COMM_WORLD_RANK": "2",
                            "RANK": "0", "PATH": "/bin", "HVD_FUSION_THRESHOLD": "1"})
    assert env == {"PATH": "/bin", "HVD_FUSION_THRESHOLD": "1"}


# -- mpiexec command lines (hosts need not exist: nothing is run) ------------------------------

def test_mpich_command_has_a_segment_per_host():
    slots = hosts.assign(3, hosts.parse_hosts("node1:2,node2:2"))
    cmd = build_command("mpiexec", "mpich", slots, ["python", "t.py"], {}, mpi_args="-v")
    assert cmd == ["mpiexec", "-hosts", "node1:2,node2:1", "-genvnone", "-v",
                   "-n", "2", "-env", "HVD_HOSTNAME", "node1", "python", "t.py", ":",
                   "-n", "1", "-env", "HVD_HOSTNAME", "node2", "python", "t.py"]
    cmd = build_command("mpiexec", "mpich", slots, ["python"], {}, ssh_port=2222)
    wrapper = cmd[cmd.index("-launcher-exec") + 1]
    assert "-p 2222" in open(wrapper).read()


def test_openmpi_command_exports_variables():
    slots = hosts.assign(2, hosts.parse_hosts("node1:1,node2:1"))
    cmd = build_command("mpirun", "openmpi", slots, ["python", "t.py"],
                        {"HVD_FUSION_THRESHOLD": "1", "HOME": "/root", "PATH": "/bin"},
                        ssh_port=22)
    assert cmd[:9] == ["mpirun", "--allow-run-as-root", "-bind-to", "none", "-map-by", "slot",
                       "-mca", "pml", "ob1"]
    assert ["-x", "HVD_FUSION_THRESHOLD"] == cmd[cmd.index("HVD_FUSION_THRESHOLD") - 1:][:2]
    assert "HOME" not in cmd and "plm_rsh_args" in cmd
    assert cmd[-13:] == ["-np", "1", "-x", "HVD_HOSTNAME=node1", "python", "t.py", ":",
                         "-np", "1", "-x", "HVD_HOSTNAME=node2", "python", "t.py"]


# A login's environment: the job's variables, what must stay on this machine, and last (as
# hvdrun adds it) a --env name.
LOGIN = {"HVD_X": "1", "PATH": "/bin", "PYTHONPATH": "/p", "HVD_HOSTNAME": "h",
         "AWS_SECRET_ACCESS_KEY": "k3y", "HOME": "/root", "MY_DATA": "/d"}
OTHER_HOSTS = "node1.invalid:1,node2.invalid:1"


@pytest.mark.parametrize("flavor", ["mpich", "openmpi"])
def test_ranks_on_other_hosts_get_the_allowlist_and_the_users_names(flavor):
    """Issue #35: the allowlist of remote.forwarded_env plus the --env names, by name (mpiexec
    reads the values from its own environment); HVD_HOSTNAME is set per host segment."""
    slots, env = hosts.assign(2, hosts.parse_hosts(OTHER_HOSTS)), dict(LOGIN)
    cmd = build_command("mpiexec", flavor, slots, ["python", "t.py"], env,
                        user_names={"MY_DATA"})
    if flavor == "mpich":
        sent = cmd[cmd.index("-genvlist") + 1].split(",")
        assert list(env)[-1] not in sent  # hydra would skip the last variable of its environment
    else:
        sent = [cmd[i + 1] for i in range(cmd.index("-np")) if cmd[i] == "-x"]
    assert sent == ["HVD_X", "MY_DATA", "PATH", "PYTHONPATH"]
    assert not any(secret in arg for arg in cmd for secret in ("AWS_", "k3y", "HOME", "/d"))


def test_mpich_keeps_the_environment_on_this_machine_or_when_asked():
    """Ranks all on this machine keep the whole environment (nothing leaves it); an
    environment choice in --mpi-args is the user's (hydra refuses two)."""
    local = hosts.assign(2, hosts.parse_hosts("localhost:1,127.0.0.1:1"))
    cmd = build_command("mpiexec", "mpich", local, ["python"], dict(LOGIN))
    assert not {"-genvlist", "-genvnone"} & set(cmd)
    remote = hosts.assign(2, hosts.parse_hosts(OTHER_HOSTS))
    cmd = build_command("mpiexec", "mpich", remote, ["python"], dict(LOGIN), mpi_args="-genvall")
    assert "-genvall" in cmd and not {"-genvlist", "-genvnone"} & set(cmd)


def test_hvdrun_sends_its_env_names_to_other_hosts(capsys, monkeypatch):
    monkeypatch.setattr(hvdrun, "find_mpiexec", lambda: None)  # hydra's syntax, any machine
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "k3y")
    monkeypatch.setenv("HVD_X", "1")
    assert hvdrun.main(["-np", "2", "-H", OTHER_HOSTS, "--env", "MY_DATA=/d", "--dry-run",
                        "python", "t.py"]) == 0
    argv = shlex.split(capsys.readouterr().out.strip())
    sent = argv[argv.index("-genvlist") + 1].split(",")
    assert {"HVD_X", "MY_DATA", "PATH"} <= set(sent) and "AWS_SECRET_ACCESS_KEY" not in sent


# hydra's "ssh [-x] HOST COMMAND": runs COMMAND on this machine in a fresh login environment,
# as sshd would on another host, so only what mpiexec forwards reaches the ranks.
FAKE_SSH = """#!/bin/sh
while [ "$1" = -x ]; do shift; done
shift
exec env -i PATH="$PATH" HOME="$HOME" sh -c "$*"
"""


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_ranks_on_other_hosts_do_not_get_the_login(tmp_path, monkeypatch, no_leaks):
    """run(fn, hosts=...) through hydra with an ssh that starts a fresh environment: a rank
    on another host sees the job's variables and env= names, not this login's secrets."""
    from hvd_magic import run
    from hvd_magic.launch.mpi import find_mpiexec, mpi_flavor
    exe = find_mpiexec()
    if exe is None or mpi_flavor(exe) != "mpich":
        pytest.skip("needs MPICH's mpiexec (hydra's -launcher-exec)")
    ssh = tmp_path / "ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(0o700)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "k3y")
    monkeypatch.setenv("HVD_X", "1")

    def seen():
        import os
        return [os.environ.get(k) for k in ("AWS_SECRET_ACCESS_KEY", "HVD_X", "MY_DATA",
                                            "HVD_HOSTNAME")]

    got = run(seen, np=2, hosts=OTHER_HOSTS, env={"MY_DATA": "/d"},
              mpi_args=f"-launcher ssh -launcher-exec {ssh}")
    assert got == [[None, "1", "/d", "node1.invalid"], [None, "1", "/d", "node2.invalid"]]


def test_hvdrun_dry_run_for_remote_hosts(capsys):
    assert hvdrun.main(["-np", "4", "-H", "node1.invalid:2,node2.invalid:2", "--dry-run",
                        "python", "train.py", "--lr", "0.1"]) == 0
    line = capsys.readouterr().out.strip()
    assert "-hosts node1.invalid:2,node2.invalid:2" in line
    assert line.count("hvd_magic.launch.rankwrap -- python train.py --lr 0.1") == 2


def test_hvdrun_leaves_the_commands_options_alone(capsys):
    """--timeline / --verb after the command are the command's, even where they would
    abbreviate hvdrun's own options (--timeline-filename, --verbose)."""
    assert hvdrun.main(["-np", "1", "--dry-run", "python", "t.py", "--timeline", "x.json",
                        "--verb"]) == 0
    assert "python t.py --timeline x.json --verb" in capsys.readouterr().out


# -- output -------------------------------------------------------------------------------------

def test_line_splitter_keeps_lines_whole():
    got = []
    s = LineSplitter(got.append)
    for chunk in (b"ab", b"c\nde", b"f\r\n\n", "é".encode()[:1]):
        s.feed(chunk)
    assert got == ["abc", "def", ""]
    s.feed("é".encode()[1:] + b"x")
    s.flush()
    assert got[-1] == "éx"


def test_rank_output_prefix_files_and_tail(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    ro = RankOutput(out, err, output_dir=str(tmp_path), only_ranks=[0])
    ro.line(0, "stdout", "hello")
    ro.line(1, "stdout", "hidden")
    ro.line(1, "stderr", "Traceback (most recent call last):")
    ro.line(1, "stderr", "ValueError: x")
    ro.line(1, "stderr", "[hvd rank 1] warning runtime: shutting down")
    ro.close()
    assert out.getvalue() == "[0]<stdout>:hello\n" and err.getvalue() == ""
    assert (tmp_path / "rank.1" / "stdout").read_text() == "hidden\n"
    assert traceback_tail(ro.tail(1)) == ["Traceback (most recent call last):", "ValueError: x"]
    assert parse_tagged("[12]<exit>:-9") == (12, "exit", "-9")
    assert parse_tagged("plain") is None


@pytest.mark.timeout(60)
def test_rankwrap_tags_lines_and_reports_exit(no_leaks):
    env = config.clean_env()
    env["PMI_RANK"] = "3"
    res = subprocess.run([sys.executable, "-m", "hvd_magic.launch.rankwrap", "--",
                          sys.executable, "-c",
                          "import sys; print('a'); print('b', file=sys.stderr); sys.exit(4)"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 4
    assert res.stdout == "[3]<stdout>:a\n"
    assert res.stderr == "[3]<stderr>:b\n[3]<exit>:4\n"


def test_blacklist_cooldown_grows_and_ends():
    """--blacklist-cooldown-range MIN MAX, Horovod's schedule: MIN*2^k + U(0,1)*MIN at the k-th
    blacklisting, within [MIN, MAX]; a failure inside the cooldown does not extend it; the host
    comes back when it ends."""
    from hvd_magic.launch.elastic_hosts import HostBook, Worker
    now = [100.0]
    book = HostBook(slots={"a": 2, "b": 2}, cooldown=(2, 10), clock=lambda: now[0],
                    jitter=lambda: 0.5)
    bad = Worker(wid="b[0]", host="b", slot=0)
    book.failed(bad)
    assert book.blacklist == {"b"} and book.until["b"] == 100.0 + 2 * 2 + 1.0
    book.failed(bad)  # during the cooldown: unchanged
    assert book.until["b"] == 105.0 and book.strikes["b"] == 1
    now[0] = 104.9
    assert book.resurrect() == [] and "b" in book.blacklist
    now[0] = 105.0
    assert book.resurrect() == ["b"] and book.blacklist == set()
    book.failed(bad)  # second strike: 2*4 + 1 = 9
    assert book.until["b"] == 105.0 + 9.0
    now[0] = 114.0
    assert book.resurrect() == ["b"]
    book.failed(bad)  # third: 2*8 + 1 = 17, capped at 10
    assert book.until["b"] == 114.0 + 10
    forever = HostBook(slots={"a": 2}, clock=lambda: now[0])
    forever.failed(Worker(wid="a[0]", host="a", slot=0))
    now[0] = 1e9
    assert forever.resurrect() == [] and forever.blacklist == {"a"}


def test_remote_worker_secrets_travel_over_stdin_not_the_command_line():
    """hvdrun's remote elastic workers (hvd_magic/launch/remote.py): the job's secret and the
    user's variables go through the ssh session's stdin, never into argv (``ps`` on either
    host); what is sent is exports the wrapper evaluates, quoted."""
    import shlex
    import subprocess

    from hvd_magic.launch.remote import env_script, remote_command
    env = {"HVD_SECRET": "s3cr3t-value", "TOKEN": "a b'c\nd", "HOSTNAME": "here",
           "BASH_FUNC_x%%": "() { :; }"}
    script = env_script(env, user_names={"TOKEN", "BASH_FUNC_x%%"})
    argv = remote_command("node-1", ["python", "train.py"], len(script), "/work", 2222, "/k")
    assert not any("s3cr3t" in a or "a b" in a for a in argv), argv
    assert argv[argv.index("--") + 1] == "node-1" and "-p" in argv and "/k" in argv
    shown = subprocess.run(["sh", "-c", script.decode() + 'printf %s "$TOKEN|$HVD_SECRET|'
                            '${HOSTNAME-unset}"'], capture_output=True, text=True,
                           env={"PATH": "/usr/bin:/bin"}, check=True).stdout
    assert shown == "a b'c\nd|s3cr3t-value|unset", shown
    remote = shlex.split(argv[-1])[2]  # sh -c <script>: the wrapper reads the exports first
    assert f"head -c {len(script)}" in remote and remote.index("eval") < remote.index("train.py")


def test_remote_workers_get_the_job_variables_not_the_login():
    """Issue #35: a remote elastic worker gets the job's variables (HVD_*, HOROVOD_*, PYTHON*,
    CUDA_*, NCCL_*, OMP_*, PATH, ...) and the names the user passed with --env, never the rest
    of this login's environment (cloud tokens, keys)."""
    from hvd_magic.launch.remote import forwarded_env
    env = {"HVD_SECRET": "s", "HOROVOD_FUSION_THRESHOLD": "1", "PYTHONPATH": "/p",
           "CUDA_VISIBLE_DEVICES": "0", "NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "2",
           "PATH": "/bin", "LD_LIBRARY_PATH": "/l", "VIRTUAL_ENV": "/v",
           "AWS_SECRET_ACCESS_KEY": "k", "GITHUB_TOKEN": "t", "HOME": "/root", "MY_DATA": "/d"}
    sent = forwarded_env(env)
    assert set(sent) == set(env) - {"AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "HOME", "MY_DATA"}
    assert forwarded_env(env, user_names={"MY_DATA"})["MY_DATA"] == "/d"
