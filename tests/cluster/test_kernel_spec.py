"""Installing the hvd cluster kernel: ``python -m hvd_magic.kernel install|uninstall``.

Only into temporary prefixes, found through JUPYTER_PATH; never the user's real folders.
No kernel is started here (tests/cluster/test_kernel.py does that).
"""

import json
import os
import subprocess
import sys

import pytest
from hvd_magic.kernel import kernelspec

pytestmark = pytest.mark.timeout(120)


def cli(*args, env=None, check=True):
    return subprocess.run([sys.executable, "-m", "hvd_magic.kernel", *args], env=env,
                          capture_output=True, text=True, timeout=60, check=check)


def listed(prefix: str) -> dict:
    env = {**os.environ, "JUPYTER_PATH": os.path.join(prefix, "share", "jupyter")}
    out = subprocess.run(["jupyter", "kernelspec", "list", "--json"], env=env, check=True,
                         capture_output=True, text=True, timeout=60).stdout
    return json.loads(out)["kernelspecs"]


def test_install_is_listed_by_jupyter_and_uninstall_removes_it(tmp_path):
    prefix = str(tmp_path)
    res = cli("install", "--prefix", prefix, "--name", "hvd-t", "-n", "3", "--launcher", "local",
              "--start-args", "--gpus none", "--env", "HVD_LOG=info")
    assert "hvd-t" in res.stdout and "3 ranks" in res.stdout
    specs = listed(prefix)
    assert "hvd-t" in specs
    spec = specs["hvd-t"]["spec"]
    assert spec["display_name"] == "Python 3 (hvd cluster)"
    assert spec["argv"][0] == sys.executable and spec["argv"][1:4] == ["-m", "hvd_magic.kernel",
                                                                        "-f"]
    assert spec["interrupt_mode"] == "signal"
    assert spec["env"] == {"HVD_KERNEL_NP": "3", "HVD_KERNEL_LAUNCHER": "local",
                           "HVD_KERNEL_START_ARGS": "--gpus none", "HVD_LOG": "info"}
    assert specs["hvd-t"]["resource_dir"].startswith(prefix)

    res = cli("uninstall", "--prefix", prefix, "--name", "hvd-t")
    assert "Removed" in res.stdout
    assert "hvd-t" not in listed(prefix)


def test_uninstall_refuses_a_kernelspec_that_is_not_ours(tmp_path):
    folder = tmp_path / "share" / "jupyter" / "kernels" / "other"
    folder.mkdir(parents=True)
    (folder / "kernel.json").write_text(json.dumps(
        {"argv": ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
         "display_name": "Other", "language": "python"}))
    res = cli("uninstall", "--prefix", str(tmp_path), "--name", "other", check=False)
    assert res.returncode == 1 and "is not the hvd cluster kernel" in res.stderr
    assert folder.exists()
    res = cli("uninstall", "--prefix", str(tmp_path), "--name", "missing", check=False)
    assert res.returncode == 1 and "no kernelspec named 'missing'" in res.stderr


def test_install_rejects_bad_values(tmp_path):
    res = cli("install", "--prefix", str(tmp_path), "-n", "0", check=False)
    assert res.returncode == 1 and "need at least one rank" in res.stderr
    res = cli("install", "--prefix", str(tmp_path), "--name", "bad name!", check=False)
    assert res.returncode == 1 and "bad name!" in res.stderr


def test_start_line_comes_from_the_kernelspec_env():
    assert kernelspec.start_line({}) == "-n 4 --launcher mpi"
    env = {"HVD_KERNEL_NP": "2", "HVD_KERNEL_LAUNCHER": "local",
           "HVD_KERNEL_START_ARGS": "--gpus none"}
    assert kernelspec.start_line(env) == "-n 2 --launcher local --gpus none"
    with pytest.raises(ValueError, match="HVD_KERNEL_NP='two'"):
        kernelspec.start_line({"HVD_KERNEL_NP": "two"})
