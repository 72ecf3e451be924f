"""Fixtures for real-browser tests: a JupyterLab server and headless Debian Chromium (Playwright).

- ``lab``: ``python -m jupyterlab`` on 127.0.0.1 with an empty token, in a fresh root, settings
  and workspace folder, its own process session, and ``HVD_TEST_TAG`` in its environment so
  every process it spawns (kernel, controller, engines) is found and killed at the end.
- ``browser_page``: a Chromium page (``executable_path`` = the system chromium; Playwright's
  own browser download is never used) with a new empty profile.
- ``artifacts``: where screenshots go: ``$HVD_TEST_ARTIFACTS`` or ``tests/browser/artifacts``
  (git-ignored).

Install what these need with ``.ci/install-browser.sh``; without it the tests skip, or fail under
``HVD_REQUIRE=browser`` (the ``browser`` tier in tests/tiers.py).
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "cluster"))
from cluster_harness import kill_strays  # noqa: E402
from tiers import chromium_path, widgets_prefix  # noqa: E402  (what the tier check found)

CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run",
                  "--disable-dev-shm-usage"]
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false",
                                                    "checkForUpdates": False},
    # Render every cell: by default JupyterLab stops rendering cells scrolled out of view, and
    # a training cell's output pushes the dashboard (in the first cell's output) out of view.
    "@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"},
}


@pytest.fixture(scope="session")
def artifacts():
    path = os.environ.get("HVD_TEST_ARTIFACTS") or os.path.join(HERE, "artifacts")
    os.makedirs(path, exist_ok=True)
    return path


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_settings(folder):
    for plugin, values in LAB_SETTINGS.items():
        package, name = plugin.split(":")
        target = os.path.join(folder, *package.split("/"))
        os.makedirs(target, exist_ok=True)
        with open(os.path.join(target, f"{name}.jupyterlab-settings"), "w") as f:
            json.dump(values, f)


def _borrowed_prefix_env(env):
    """JupyterLab looks for extensions (and their server config) only under its own prefix. In
    a venv that borrows the system's site-packages the extensions live under the system's
    prefix: without this every widget renders as its text repr, and lab extensions whose
    server half is not enabled pop up error dialogs. Point both paths at that prefix."""
    prefix = widgets_prefix()
    if prefix is None or os.path.realpath(prefix) == os.path.realpath(sys.prefix):
        return
    for var, sub in (("JUPYTER_PATH", ("share", "jupyter")),
                     ("JUPYTER_CONFIG_PATH", ("etc", "jupyter"))):
        env[var] = os.pathsep.join(p for p in (os.path.join(prefix, *sub), env.get(var)) if p)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A running JupyterLab; yields (base url, root folder, tag)."""
    base = tmp_path_factory.mktemp("lab")
    root, settings, workspaces = base / "root", base / "settings", base / "workspaces"
    for folder in (root, settings, workspaces):
        folder.mkdir()
    _write_settings(str(settings))
    tag = f"browser-{uuid.uuid4().hex[:10]}"
    env = {k: v for k, v in os.environ.items() if k not in ("IPP_NONINTERACTIVE", "HVD_DASHBOARD")}
    repo = os.path.dirname(os.path.dirname(HERE))  # the kernel imports this checkout
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    _borrowed_prefix_env(env)
    env.update(HVD_TEST_TAG=tag, JUPYTERLAB_SETTINGS_DIR=str(settings),
               JUPYTERLAB_WORKSPACES_DIR=str(workspaces), JUPYTER_RUNTIME_DIR=str(base / "rt"))
    port = _free_port()
    log = open(base / "lab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         "--IdentityProvider.token=", "--ServerApp.password=", f"--ServerApp.root_dir={root}",
         "--ServerApp.port_retries=0"] + (["--allow-root"] if os.geteuid() == 0 else []),
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/status", timeout=5):
                    break
            except OSError:
                assert proc.poll() is None, (base / "lab.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "JupyterLab did not answer within 120 s"
                time.sleep(0.5)
        yield url, root, tag
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        log.close()
        kill_strays(tag=tag)  # the kernel and the cluster it started


@pytest.fixture
def browser_page(tmp_path):
    from playwright.sync_api import sync_playwright

    profile = tmp_path / "chromium-profile"  # a new, empty user-data-dir
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(profile), executable_path=chromium_path(), headless=True, args=CHROMIUM_FLAGS,
            viewport={"width": 1400, "height": 1000})
        try:
            yield context.pages[0] if context.pages else context.new_page()
        finally:
            context.close()
