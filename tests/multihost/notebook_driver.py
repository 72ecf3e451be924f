"""The notebook side of tests/multihost/test_hvd_start_ssh.py, run on host a: an IPython shell
with hvd_magic starts ``%hvd_start -n 4 --launcher ssh --hosts a:2,b:2``, runs ``%%hvd``
cells on the ranks, notes where the dashboard listens and which ranks it heard from, stops the
cluster, and prints one ``NB-RESULT {json}`` line.

Environment: ``MH_ADDRESSES`` ("a=10.231.0.1,b=..."), passed on to the engines.
"""
import io
import json
import os
import sys
import time
from contextlib import redirect_stderr, redirect_stdout

CELL = """%%hvd --out where
import os, socket
import numpy as np
def _bindable():
    out = []
    for item in os.environ["MH_ADDRESSES"].split(","):
        host, address = item.split("=")
        with socket.socket() as s:
            try:
                s.bind((address, 0))
                out.append(host)
            except OSError:
                pass
    return out
x = hvd.allreduce(torch.arange(4.0) * (hvd.rank() + 1), op=hvd.Sum, name="x").tolist()
big = hvd.allreduce(torch.ones(1 << 20), op=hvd.Sum, name="big")
core = __import__("engine_native").metrics()
dict(rank=hvd.rank(), local_rank=hvd.local_rank(), local_size=hvd.local_size(),
     cross_rank=hvd.cross_rank(), cross_size=hvd.cross_size(), host=socket.gethostname(),
     bindable=_bindable(), x=x, big_ok=bool((big == hvd.size()).all()),
     transports=core["transports"])
"""


def run(ip, code: str) -> dict:
    out, err = io.StringIO(), io.StringIO()
    began = time.monotonic()
    with redirect_stdout(out), redirect_stderr(err):
        res = ip.run_cell(code, store_history=False)
    print(f"NB-STEP {code.split()[0]} {time.monotonic() - began:.1f} s", file=sys.stderr, flush=True)
    error = res.error_in_exec or res.error_before_exec
    return {"ok": error is None, "error": repr(error) if error else None,
            "out": out.getvalue()[-3000:], "err": err.getvalue()[-3000:]}


def dashboard_seen() -> dict:
    """Where the dashboard's hub listens and the ranks whose snapshots reached it."""
    import hvd_magic

    hub = hvd_magic._magics.dashboard.hub
    hub.wait_for_ranks(range(4), 30)
    return {"address": hub.address,
            "ranks": sorted(r.rank for r in hub.model.rows(time.monotonic()) if r.pid)}


def main() -> None:
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_cell("%load_ext hvd_magic", store_history=False)
    report = {}
    env = f"--env MH_ADDRESSES={os.environ['MH_ADDRESSES']}"
    report["start"] = run(ip, f"%hvd_start -n 4 --launcher ssh --hosts a:2,b:2 --gpus none "
                              f"--timeout 90 {env}")
    try:
        if report["start"]["ok"]:
            report["cell"] = run(ip, CELL)
            report["where"] = ip.user_ns.get("where")
            report["dashboard"] = dashboard_seen()
    finally:
        report["stop"] = run(ip, "%hvd_stop")
    print("NB-RESULT " + json.dumps(report, default=repr), flush=True)


if __name__ == "__main__":
    sys.exit(main())
