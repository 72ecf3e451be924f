"""The function tests/multihost/test_run_hosts.py runs on every rank with ``hvd_magic.run``
(importable by path on every host: the hosts share this file system)."""
import os
import socket


def where_am_i() -> dict:
    """This rank's place, the network stack it runs in, and one allreduce's result."""
    import numpy as np

    import engine_native as hvd

    hvd.init()
    addresses = dict(item.split("=") for item in os.environ["MH_ADDRESSES"].split(","))
    bindable = []
    for host, address in sorted(addresses.items()):
        with socket.socket() as s:
            try:
                s.bind((address, 0))
                bindable.append(host)
            except OSError:
                pass
    total = hvd.allreduce(np.full(3, hvd.rank() + 1.0), op=hvd.Sum, name="sum").tolist()
    out = {"rank": hvd.rank(), "local_rank": hvd.local_rank(), "cross_rank": hvd.cross_rank(),
           "local_size": hvd.local_size(), "transports": hvd.metrics()["transports"],
           "bindable": bindable, "sum": total,
           "login_secret": "AWS_SECRET_ACCESS_KEY" in os.environ}  # the driver sets it
    hvd.shutdown()
    return out
