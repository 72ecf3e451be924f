"""The magics inside a real Jupyter kernel (ipykernel via jupyter_client), where ``%%hvd``
cells are awaited: Jupyter's interrupt (SIGINT to the kernel's process group) and a comm
message (what the dashboard's Stop button sends) both stop a running cell, the cluster
survives both, and ending the kernel (shutdown, or SIGKILL: the reaper) leaves no cluster
process behind.
"""

import signal
import time

import pytest
from cluster_harness import cluster_processes, kill_strays
from notebook_cells import per_rank

pytestmark = pytest.mark.timeout(240)

# Every rank says it is running (the readiness handshake: the test interrupts only then), and
# rank 0 then stays in the cell.
RUNNING = "cell is running"
STUCK = ("%%hvd\nimport time\nimport hvd_magic.engine_side as es\n"
         f"print({RUNNING!r}, flush=True)\n"
         "if es.RANK == 0:\n    time.sleep(60)\n'done'")

# Rank 0 submits 'grad', which rank 1 never does, and says so once its core lists it as
# pending (refreshed every 200 ms): what the interrupt's report is built from.
STUCK_IN_GRAD = """%%hvd
import time
import engine_native.basics as core
x = torch.ones(4)
if hvd.rank() == 0:
    h = hvd.allreduce_async(x, name='grad')
    deadline = time.monotonic() + 30
    while not any('grad' in p['name'] for p in core.metrics()['pending']):
        assert time.monotonic() < deadline, 'grad never showed as pending'
        time.sleep(0.02)  # polling the core's state, with a deadline
    print('grad in flight', flush=True)
    hvd.synchronize(h)
'done'
"""


class Kernel:
    def __init__(self):
        from jupyter_client.manager import start_new_kernel

        self.km, self.kc = start_new_kernel(kernel_name="python3", startup_timeout=60)
        self.seen = []  # messages of the running cell read by wait_for, for collect

    def start(self, code):
        self.seen = []
        return self.kc.execute(code)

    def _messages(self, msg_id, deadline):
        """``msg_id``'s IOPub messages: those wait_for already read, then new ones."""
        yield from self.seen
        while time.monotonic() < deadline:
            msg = self.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            if msg["parent_header"].get("msg_id") == msg_id:
                yield msg

    def wait_for(self, msg_id, needle, timeout=60):
        """Block until ``msg_id`` streams a line containing ``needle`` (the cell told us it
        runs); the messages read stay available to :meth:`collect`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = self.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            self.seen.append(msg)
            kind, content = msg["header"]["msg_type"], msg["content"]
            if kind == "stream" and needle in content["text"]:
                return
            if kind == "status" and content["execution_state"] == "idle":
                break
        raise TimeoutError(f"{msg_id} did not print {needle!r} within {timeout} s, or ended "
                           f"first: {[m['content'] for m in self.seen]}")

    def collect(self, msg_id, timeout=60):
        """Text of every output of ``msg_id`` (streams, results, errors) and the error name."""
        text, ename = [], None
        deadline = time.monotonic() + timeout
        for msg in self._messages(msg_id, deadline):
            kind, content = msg["header"]["msg_type"], msg["content"]
            if kind == "stream":
                text.append(content["text"])
            elif kind in ("execute_result", "display_data"):
                text.append(content["data"].get("text/plain", "") + "\n")
            elif kind == "error":
                ename = content["ename"]
                text.append("\n".join(content["traceback"]))
            elif kind == "status" and content["execution_state"] == "idle":
                return "".join(text), ename
        raise TimeoutError(f"no idle status for {msg_id} within {timeout} s")

    def run(self, code, timeout=120):
        return self.collect(self.start(code), timeout)

    def close(self):
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)


@pytest.fixture(scope="module")
def kernel():
    k = Kernel()
    text, ename = k.run("%load_ext hvd_magic\n%hvd_start -n 2 --launcher local")
    assert ename is None, text
    cid, _ = k.run("print(__import__('hvd_magic')._magics.cluster.ipp.cluster_id)")
    k.cluster_id = cid.strip()
    yield k
    k.close()
    kill_strays([k.cluster_id])


def test_cell_result_and_streamed_output(kernel):
    text, ename = kernel.run("%%hvd\nprint('hello from every rank')\n6 * 7")
    assert ename is None, text
    assert per_rank(text, "hello from every rank", 2) == [""] * 2, text
    assert "42" in text


def test_jupyter_interrupt_stops_every_rank_and_cluster_stays(kernel):
    msg_id = kernel.start(STUCK)
    kernel.wait_for(msg_id, RUNNING)
    t0 = time.monotonic()
    kernel.km.interrupt_kernel()
    text, ename = kernel.collect(msg_id, timeout=30)
    assert ename == "CellInterrupted", text
    assert "keyboard interrupt" in text
    assert time.monotonic() - t0 < 20  # (against the cell's 60 s sleep)
    text, ename = kernel.run("%%hvd\nprint('still here')")
    assert ename is None and per_rank(text, "still here", 2) == [""] * 2, text


def test_comm_message_stops_an_awaiting_cell(kernel):
    """Comms are handled while an awaited %%hvd cell runs (ipykernel >= 7.4): the Stop path."""
    text, ename = kernel.run(
        "import hvd_magic\n"
        "def _target(comm, open_msg):\n"
        "    comm.on_msg(lambda msg: hvd_magic.interrupt_running_cell('stop button'))\n"
        "get_ipython().kernel.comm_manager.register_target('hvd_test_stop', _target)")
    assert ename is None, text
    msg_id = kernel.start(STUCK)
    kernel.wait_for(msg_id, RUNNING)
    session, shell = kernel.kc.session, kernel.kc.shell_channel
    shell.send(session.msg("comm_open", {"comm_id": "c1", "target_name": "hvd_test_stop",
                                         "data": {}}))
    shell.send(session.msg("comm_msg", {"comm_id": "c1", "data": {"stop": True}}))
    text, ename = kernel.collect(msg_id, timeout=30)
    assert ename == "CellInterrupted", text
    assert "stop button" in text


def test_interrupt_in_a_stuck_collective_reports_and_recovers(kernel):
    msg_id = kernel.start(STUCK_IN_GRAD)
    kernel.wait_for(msg_id, "grad in flight")
    kernel.km.interrupt_kernel()
    text, ename = kernel.collect(msg_id, timeout=30)
    assert ename == "CellInterrupted", text
    assert "rank 0: stuck in allreduce 'grad'" in text and "waiting on rank 1" in text
    text, ename = kernel.run("%%hvd\nhvd.allreduce(torch.ones(1), op=hvd.Sum).item()")
    assert ename is None and "2.0" in text, text


@pytest.mark.parametrize("how", ["shutdown", "kill"])
def test_kernel_end_stops_the_cluster(how):
    """A clean shutdown stops it through atexit; a SIGKILLed kernel through the reaper."""
    k = Kernel()
    try:
        text, ename = k.run("%load_ext hvd_magic\n%hvd_start -n 2 --launcher local\n"
                            "print('CID', __import__('hvd_magic')._magics.cluster.ipp.cluster_id)")
        assert ename is None, text
        cid = text.split("CID", 1)[1].split()[0]
        assert cluster_processes([cid])
    finally:
        if how == "kill":
            k.km.signal_kernel(signal.SIGKILL)
        k.close()
    deadline = time.monotonic() + 20
    while cluster_processes([cid]) and time.monotonic() < deadline:
        time.sleep(0.25)
    left = cluster_processes([cid])
    kill_strays([cid])
    assert not left, [p.pid for p in left]
