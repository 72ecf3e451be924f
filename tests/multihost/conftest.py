"""Fixtures for tests/multihost: hosts made of network namespaces (netns_hosts.py).

``namespace_hosts_ab``: hosts ``a`` and ``b`` with their own addresses and sshd, for one
module; torn down (daemons, every process left in a namespace, the namespaces) even when a
test fails or times out. The folder's tests carry the ``multihost`` marker (tests/conftest.py),
so they skip without root, ``ip netns`` or sshd, and fail under ``HVD_REQUIRE=multihost``.
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from netns_hosts import namespace_hosts


@pytest.fixture(scope="module")
def namespace_hosts_ab():
    with namespace_hosts(("a", "b")) as hosts:
        yield hosts
