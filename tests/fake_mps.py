"""A fake ``nvidia-cuda-mps-control`` for MPS tests without a GPU (tests/ is on sys.path).

:func:`fake_mps_control` writes the program into a folder for PATH. It behaves as the real one
does at the level hvd_magic.launch.mps uses it:

- ``-d`` starts a daemon (a new session, its parent exits) that creates
  ``$CUDA_MPS_PIPE_DIRECTORY/control`` (a FIFO) and ``$CUDA_MPS_LOG_DIRECTORY/control.log``,
  and stays until it reads ``quit`` on the FIFO;
- without arguments it is a client: it sends its stdin's commands to the daemon of
  ``$CUDA_MPS_PIPE_DIRECTORY``, or says ``Cannot find MPS control daemon process`` and exits 1.

Every request is appended to ``$FAKE_MPS_RECORD`` as ``<what> <pipe dir>``: ``start``,
``serve`` (the daemon came up), the commands the daemon read, ``exit``. ``FAKE_MPS_FAIL``:
``exit`` (``-d`` fails at once), ``silent`` (the daemon logs an error and ends before its FIFO
exists), ``silent-rc0`` (the same, and the client says it found no daemon but exits 0, which
some driver versions may do), ``stubborn`` (the daemon ignores ``quit``).
"""
import os
import stat
import sys

PROGRAM = r'''#!{python}
import os, subprocess, sys

PIPE = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
LOG = os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps")
FIFO = os.path.join(PIPE, "control")
FAIL = os.environ.get("FAKE_MPS_FAIL", "")


def record(what):
    path = os.environ.get("FAKE_MPS_RECORD")
    if path:
        with open(path, "a") as fh:
            fh.write(f"{{what}} {{PIPE}}\n")


def log(text):
    with open(os.path.join(LOG, "control.log"), "a") as fh:
        fh.write(text + "\n")


def serve():
    if FAIL.startswith("silent"):
        log("[fake] cannot start the MPS control daemon: fake failure for the test")
        return
    os.mkfifo(FIFO)
    log("[fake] MPS control daemon started")
    record("serve")
    fd = os.open(FIFO, os.O_RDWR)  # a writer of its own: reads block instead of seeing EOF
    with os.fdopen(fd) as fifo:
        for line in fifo:
            record(line.strip())
            if line.strip() == "quit" and FAIL != "stubborn":
                break
    os.unlink(FIFO)
    record("exit")


def client():
    try:
        fd = os.open(FIFO, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO: no daemon reads it
    except OSError:
        print("Cannot find MPS control daemon process")
        return 0 if FAIL == "silent-rc0" else 1
    with os.fdopen(fd, "w") as fifo:
        fifo.write(sys.stdin.read())
    return 0


if sys.argv[1:] == ["-d"]:
    record("start")
    if FAIL == "exit":
        print("[fake] An instance of this daemon is already running", file=sys.stderr)
        sys.exit(1)
    subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve"],
                     start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
elif sys.argv[1:] == ["--serve"]:
    serve()
else:
    sys.exit(client())
'''


def fake_mps_control(folder) -> str:
    """Write ``folder/nvidia-cuda-mps-control``; returns ``folder`` (for PATH)."""
    os.makedirs(folder, exist_ok=True)
    exe = os.path.join(folder, "nvidia-cuda-mps-control")
    with open(exe, "w") as fh:
        fh.write(PROGRAM.format(python=sys.executable))
    os.chmod(exe, os.stat(exe).st_mode | stat.S_IEXEC)
    return str(folder)


def records(path) -> list:
    """``[(what, pipe dir), ...]`` from a FAKE_MPS_RECORD file (empty when none)."""
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        return [tuple(line.split(" ", 1)) for line in fh.read().splitlines()]


def fake_smi_modes(folder, modes) -> str:
    """Write ``folder/nvidia-smi`` that answers the compute-mode query with ``modes`` (one per
    GPU) and the discovery query with as many GPUs; returns ``folder``."""
    os.makedirs(folder, exist_ok=True)
    exe = os.path.join(folder, "nvidia-smi")
    mode_rows = "".join(f"echo '{i}, {m}'\n" for i, m in enumerate(modes))
    gpu_rows = "".join(f"echo '{i}, GPU-{i:04d}-fake, NVIDIA Fake, 40960'\n"
                       for i in range(len(modes)))
    with open(exe, "w") as fh:
        fh.write("#!/bin/sh\ncase \"$1\" in\n  --query-gpu=index,compute_mode)\n"
                 + mode_rows + "    ;;\n  *)\n" + gpu_rows + "    ;;\nesac\n")
    os.chmod(exe, os.stat(exe).st_mode | stat.S_IEXEC)
    return str(folder)
