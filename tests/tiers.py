"""The optional test tiers and what each needs: one check per tier, shared by the root conftest
(which skips a tier's tests, or fails them when ``HVD_REQUIRE`` names the tier) and by the
fixtures that use what the check found (``chromium_path``, ``widgets_prefix``).

A tier is optional because it needs something outside the project's Python dependencies: a
GPU, a browser, a Java runtime, an MPI launcher. Everything the ``test`` extra installs is not
a tier: a test imports it directly and fails loudly when the install is broken.
"""
import functools
import importlib.util
import os
import shutil
import subprocess
import sys

TIERS = ("gpu", "browser", "spark", "mpi", "multihost", "jax", "keras", "tensorflow")


def chromium_path():
    """The browser Playwright drives: ``$HVD_CHROMIUM`` when set (and only it: a wrong path is
    an error, never a silent fallback to another browser), else the first Chromium on PATH."""
    chosen = os.environ.get("HVD_CHROMIUM", "")
    if chosen:
        found = shutil.which(chosen)
        return os.path.abspath(found) if found else None
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def widgets_prefix():
    """The install prefix holding ipywidgets' JupyterLab extension, or None without it."""
    spec = importlib.util.find_spec("jupyterlab_widgets")
    if spec is None or not spec.origin:
        return None
    prefix = os.path.abspath(os.path.join(os.path.dirname(spec.origin), *[".."] * 4))
    manager = os.path.join(prefix, "share", "jupyter", "labextensions", "@jupyter-widgets",
                           "jupyterlab-manager")
    return prefix if os.path.isdir(manager) else None


@functools.lru_cache(maxsize=None)
def _missing_gpu():
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    code = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    try:  # a subprocess: importing torch + CUDA init stays out of the test process
        ok = subprocess.run([sys.executable, "-c", code], capture_output=True,
                            timeout=120).returncode == 0
    except subprocess.TimeoutExpired:
        ok = False
    return None if ok else "no CUDA GPU available"


@functools.lru_cache(maxsize=None)
def _missing_browser():
    if chromium_path() is None:
        if os.environ.get("HVD_CHROMIUM"):
            return f"HVD_CHROMIUM={os.environ['HVD_CHROMIUM']!r} is not an executable"
        return "no Chromium executable (apt-get install chromium, or set HVD_CHROMIUM)"
    for module in ("playwright", "jupyterlab"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (run .ci/install-browser.sh)"
    if widgets_prefix() is None:
        return ("ipywidgets' JupyterLab extension (jupyterlab_widgets) is not installed "
                "(run .ci/install-browser.sh)")
    return None


@functools.lru_cache(maxsize=None)
def _missing_spark():
    if importlib.util.find_spec("pyspark") is None:
        return "pyspark is not installed (run .ci/install-spark.sh)"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "no Java runtime for Spark (run .ci/install-spark.sh)"
    return None


@functools.lru_cache(maxsize=None)
def _missing_mpi():
    from multiproc.harness import find_mpiexec  # tests/ is on sys.path (rootdir-relative import)

    if find_mpiexec() is None:
        return "mpiexec not found (pip install mpich, or install a system MPI)"
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed"
    return None


@functools.lru_cache(maxsize=None)
def _missing_multihost():
    """Hosts made of network namespaces (tests/multihost): root, ``ip netns``, sshd, and
    mpiexec (hvdrun reaches other hosts through it)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) not found (run .ci/install-sshd.sh)"
    if not os.access("/usr/sbin/sshd", os.X_OK) or shutil.which("ssh") is None:
        return "sshd/ssh not installed (run .ci/install-sshd.sh)"
    try:
        probe = subprocess.run(["ip", "netns", "list"], capture_output=True, timeout=30,
                               check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`ip netns` does not run: {exc}"
    if probe.returncode != 0:
        return f"`ip netns` fails: {probe.stderr.decode(errors='replace').strip()}"
    return _missing_mpi()


def _missing_framework(*modules):
    """A framework tier (engine_native.jax, .keras, .tensorflow): its packages importable, as
    .ci/install-frameworks.sh installs them (pinned)."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (run .ci/install-frameworks.sh)"
    return None


_CHECKS = {"gpu": _missing_gpu, "browser": _missing_browser, "spark": _missing_spark,
           "mpi": _missing_mpi, "multihost": _missing_multihost,
           "jax": functools.partial(_missing_framework, "jax", "optax"),
           "keras": functools.partial(_missing_framework, "keras"),
           "tensorflow": functools.partial(_missing_framework, "tensorflow")}


def missing(tier: str):
    """Why ``tier`` cannot run here, or None when it can."""
    return _CHECKS[tier]()


def required(environ=None) -> set:
    """The tiers ``HVD_REQUIRE`` names; an unknown name is an error (a typo would otherwise
    turn a requirement into a skip)."""
    value = (os.environ if environ is None else environ).get("HVD_REQUIRE", "")
    names = {r.strip() for r in value.split(",") if r.strip()}
    unknown = sorted(names - set(TIERS))
    if unknown:
        raise ValueError(f"HVD_REQUIRE={value!r}: unknown tier(s) {', '.join(unknown)}; "
                         f"known tiers: {', '.join(TIERS)}")
    return names
