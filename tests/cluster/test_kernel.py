"""The hvd cluster kernel as Jupyter runs it: a real kernel process driven through jupyter_client.

The kernelspec is installed into a temporary prefix (``python -m hvd_magic.kernel install
--prefix``) and found through ``JUPYTER_PATH``, never in the user's folders. One kernel (two
ranks, local launcher) serves the first tests, which run in file order: the last of them
restart it and shut it down. The tests after those start kernels of their own (a bad
kernelspec, the MPI launcher). Every process a kernel spawns inherits ``HVD_TEST_TAG``: the
``tag`` fixture kills whatever still carries it at the end, and fails if it had to.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field

import pytest
from cluster_harness import cluster_processes, kill_strays
from notebook_cells import per_rank

pytestmark = pytest.mark.timeout(300)

NAME = "hvd-cluster-test"
START = 240  # s for a first cell that starts the cluster (a loaded 2-core machine is slow)


@dataclass
class Reply:
    """Everything a cell sent back."""
    out: str = ""
    results: list = field(default_factory=list)  # text/plain of execute_result
    ename: str | None = None
    error: str = ""
    content: dict = field(default_factory=dict)  # the execute_reply

    @property
    def text(self) -> str:
        return self.out + "".join(r + "\n" for r in self.results) + self.error


class Kernel:
    """A kernel started from the installed kernelspec ``name`` (found via JUPYTER_PATH)."""

    def __init__(self, name: str, env: dict):
        from jupyter_client.manager import KernelManager

        self.km = KernelManager(kernel_name=name)
        self.km.start_kernel(env=env)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)
        self.closed = False

    def start(self, code: str) -> str:
        return self.kc.execute(code)

    def collect(self, msg_id: str, timeout: float = START, until: str | None = None) -> Reply:
        """Outputs of ``msg_id`` until the kernel is idle (or until ``until`` appears in its
        stream output, then return early without the reply)."""
        r = Reply()
        deadline = time.monotonic() + timeout
        while True:
            msg = self.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, c = msg["header"]["msg_type"], msg["content"]
            if kind == "stream":
                r.out += c["text"]
                if until and until in r.out:
                    return r
            elif kind == "execute_result":
                r.results.append(c["data"].get("text/plain", ""))
            elif kind == "display_data":
                r.out += c["data"].get("text/plain", "") + "\n"
            elif kind == "error":
                r.ename, r.error = c["ename"], "\n".join(c["traceback"])
            elif kind == "status" and c["execution_state"] == "idle":
                break
        while True:
            msg = self.kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
            if msg["parent_header"].get("msg_id") == msg_id:
                r.content = msg["content"]
                return r

    def run(self, code: str, timeout: float = START) -> Reply:
        return self.collect(self.start(code), timeout)

    def ok(self, code: str, timeout: float = START) -> Reply:
        r = self.run(code, timeout)
        assert r.ename is None and r.content.get("status") == "ok", r.text
        return r

    def cluster_id(self) -> str:
        """The running cluster's id (a ranks cell first starts one if there is none)."""
        self.ok("pass")
        r = self.ok("%%local\nprint(get_ipython().magics_manager.registry['HvdMagics']"
                    ".cluster.ipp.cluster_id)")
        return r.out.strip()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.kc.stop_channels()
            self.km.shutdown_kernel(now=False)


def install(prefix: str, name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hvd_magic.kernel", "install", "--prefix",
                           prefix, "--name", name, *args],
                          capture_output=True, text=True, timeout=120, check=True)


def wait_gone(cluster_ids=(), tag=None, timeout: float = 30.0) -> list:
    """Processes of ``cluster_ids`` (or carrying ``tag``) still alive after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while (left := cluster_processes(list(cluster_ids), tag)) and time.monotonic() < deadline:
        time.sleep(0.25)
    return left


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    """A temporary prefix with the kernelspec, on JUPYTER_PATH for the module."""
    root = str(tmp_path_factory.mktemp("jupyter-prefix"))
    install(root, NAME, "-n", "2", "--launcher", "local", "--start-args", "--gpus none")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JUPYTER_PATH", os.path.join(root, "share", "jupyter"))
        yield root


@pytest.fixture(scope="module")
def tag():
    """Kills every process started under this tag (kernel, controller, engines, nannies,
    mpiexec) when the module ends, even after a failure; fails if anything was left."""
    value = uuid.uuid4().hex
    yield value
    left = wait_gone(tag=value, timeout=20)
    kill_strays([], value)
    assert not left, f"processes left running: {[p.pid for p in left]}"


def kernel_env(tag: str, **extra) -> dict:
    # dashboard off: in text mode it prints a status line into whatever cell is current when
    # rank states change, which would land in the outputs these tests compare
    return {**os.environ, "HVD_TEST_TAG": tag, "HVD_DASHBOARD": "off",
            "HVD_KERNEL_QUERY_TIMEOUT": "60", **extra}


@pytest.fixture(scope="module")
def kernel(prefix, tag):
    k = Kernel(NAME, kernel_env(tag))
    yield k
    with contextlib.suppress(Exception):
        k.close()


def test_first_cell_starts_the_cluster_and_runs_on_every_rank(kernel):
    r = kernel.ok("import hvd_magic.engine_side as es\n"
                  "print('hello from every rank')\n"
                  "print('I am rank', es.RANK)\n"
                  "who = f'rank {es.RANK}'\n"
                  "es.RANK * 10 + 7")
    assert "hvd cluster: 2 ranks, local launcher" in r.out, r.text
    assert per_rank(r.out, "hello from every rank", 2) == [""] * 2, r.out
    assert "[rank 0] I am rank 0" in r.out and "[rank 1] I am rank 1" in r.out
    assert r.results == ["7"]  # rank 0's last expression
    r = kernel.ok("who")  # state survives between cells
    assert r.results == ["'rank 0'"]


def test_local_cells_and_line_magics_run_in_the_kernel(kernel):
    r = kernel.ok("%%local\nimport os\nonly_on_driver = 'driver'\nos.getpid()")
    assert r.results == [str(kernel.km.provisioner.pid)]
    r = kernel.run("only_on_driver")
    assert r.ename is not None and "NameError on all ranks" in r.text, r.text
    r = kernel.ok("%hvd_status")
    assert "hvd cluster: 2 ranks, local launcher" in r.out and "idle" in r.out
    r = kernel.ok("%%hvd --ranks 1\nprint('only rank', es.RANK)")
    assert "only rank 1" in r.out and "only rank 0" not in r.out


def test_completion_and_inspection_answer_from_rank_0(kernel):
    kernel.ok("import hvd_magic.engine_side as es\n"
              "if es.RANK == 0:\n    only_on_rank0 = 1\nelse:\n    only_on_rank1 = 1\n"
              "def documented_on_ranks(a, b=2):\n    'Adds a and b on the ranks.'\n"
              "    return a + b")
    kernel.ok("%%local\nonly_on_driver_too = 1")

    def complete(code, pos=None):
        return kernel.kc.complete(code, pos, reply=True, timeout=120)["content"]

    reply = complete("only_on_")
    assert "only_on_rank0" in reply["matches"], reply
    assert "only_on_rank1" not in reply["matches"] and "only_on_driver" not in reply["matches"]
    head = "%%hvd --ranks 0\n"
    reply = complete(head + "only_on_r")
    assert "only_on_rank0" in reply["matches"] and reply["cursor_start"] == len(head), reply
    reply = complete("%%local\nonly_on_")
    assert "only_on_driver_too" in reply["matches"] and "only_on_rank0" not in reply["matches"]

    code = "documented_on_ranks("
    reply = kernel.kc.inspect(code, len(code), reply=True, timeout=120)["content"]
    assert reply["found"] and "Adds a and b on the ranks." in reply["data"]["text/plain"]
    r = kernel.ok("documented_on_ranks?")  # a help cell: rank 0's answer in the pager
    pages = [p for p in r.content["payload"] if p.get("source") == "page"]
    assert pages and "Adds a and b on the ranks." in pages[0]["data"]["text/plain"], r.content


def test_interrupt_in_a_stuck_collective_returns_and_the_next_cell_works(kernel):
    cid = kernel.cluster_id()
    pids = {p.pid for p in cluster_processes([cid])}
    msg_id = kernel.start("x = torch.ones(4)\n"
                          "if hvd.rank() == 0:\n    hvd.allreduce(x, name='grad')\n'done'")
    # rank 1 skipped the allreduce; the cell's stall warning says rank 0 is in it
    seen = kernel.collect(msg_id, timeout=90, until="in allreduce 'grad'")
    t0 = time.monotonic()
    kernel.km.interrupt_kernel()
    r = kernel.collect(msg_id, timeout=60)
    assert r.ename == "CellInterrupted", seen.text + r.text
    assert "stuck in allreduce 'grad'" in r.error and "waiting on rank 1" in r.error, r.text
    assert time.monotonic() - t0 < 30
    r = kernel.ok("hvd.allreduce(torch.ones(1), op=hvd.Sum).item()")
    assert r.results == ["2.0"]
    assert kernel.cluster_id() == cid  # the same processes: nothing was restarted or killed
    assert {p.pid for p in cluster_processes([cid])} == pids


def test_restart_stops_the_cluster_and_the_next_cell_starts_a_new_one(kernel):
    old = kernel.cluster_id()
    assert cluster_processes([old])
    kernel.km.restart_kernel(now=False)
    kernel.kc.wait_for_ready(timeout=120)
    left = wait_gone([old])
    assert not left, [(p.pid, p.info["cmdline"]) for p in left]
    r = kernel.ok("import hvd_magic.engine_side as es\nes.RANK")
    assert "hvd cluster: 2 ranks, local launcher" in r.out and r.results == ["0"], r.text
    assert kernel.cluster_id() != old


def test_shutdown_stops_the_cluster(kernel, tag):
    cid = kernel.cluster_id()
    kernel.close()
    left = wait_gone([cid], tag)  # the kernel and all it started, reaper included
    assert not left, [(p.pid, p.info["cmdline"]) for p in left]


def test_bad_kernelspec_env_starts_nothing_until_a_first_hvd_start(prefix):
    install(prefix, NAME + "-bad", "--launcher", "local", "--env", "HVD_KERNEL_NP=zero")
    tag = uuid.uuid4().hex  # this kernel's own: the module's kernel may be running
    k = Kernel(NAME + "-bad", kernel_env(tag))
    cid = None
    try:
        info = k.kc.kernel_info(reply=True, timeout=60)["content"]
        assert info["implementation"] == "hvd_cluster"
        assert "debugger" not in info.get("supported_features", [])
        assert k.ok("# nothing to run\n").out == ""  # an empty cell starts no cluster
        r = k.run("%hvd_status")  # line magics run in the driver
        assert r.content["ename"] == "UsageError" and "no hvd cluster is running" in r.out
        r = k.run("x = 1")
        assert r.content["ename"] == "UsageError" and "HVD_KERNEL_NP='zero'" in r.out, r.text
        assert r.content["execution_count"] == 3
        assert [p.pid for p in cluster_processes([], tag)] == [k.km.provisioner.pid]
        k.ok("%hvd_start -n 1 --launcher local --gpus none")  # a first-cell %hvd_start wins
        r = k.ok("import hvd_magic.engine_side as es\nes.RANK")
        assert r.results == ["0"]
        cid = k.cluster_id()
    finally:
        k.close()
        left = wait_gone([cid] if cid else [], tag)
        kill_strays([], tag)
    assert not left, [(p.pid, p.info["cmdline"]) for p in left]


@pytest.mark.mpi
def test_mpi_launcher(prefix, tag):
    install(prefix, NAME + "-mpi", "-n", "2", "--launcher", "mpi", "--start-args", "--gpus none")
    k = Kernel(NAME + "-mpi", kernel_env(tag))
    try:
        r = k.ok("from mpi4py import MPI\n"
                 "print('mpi rank', MPI.COMM_WORLD.Get_rank(), 'of', MPI.COMM_WORLD.Get_size())\n"
                 "hvd.allreduce(torch.ones(1), op=hvd.Sum).item()")
        assert "hvd cluster: 2 ranks, mpi launcher" in r.out, r.text
        assert "[rank 0] mpi rank 0 of 2" in r.out and "[rank 1] mpi rank 1 of 2" in r.out
        assert r.results == ["2.0"]
        cid = k.cluster_id()
    finally:
        k.close()
    left = wait_gone([cid], tag)  # mpiexec, engines, nannies, controller, kernel
    assert not left, [(p.pid, p.info["cmdline"]) for p in left]
