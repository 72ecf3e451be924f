"""Horovod's ``torch.cuda.set_device(hvd.local_rank())`` in pinned ranks (hvd_magic.gpu_compat):
the one ordinal that is this rank's local rank maps to the pinned GPU (cuda:0) when it is not a
visible device; everything else passes through. Installed in-process (engines, run() tasks)
and, for hvdrun's foreign commands, by gpu_site/sitecustomize.py, which then runs the
sitecustomize it hides. A tiny fake torch package stands in for torch in the subprocesses."""
import json
import os
import subprocess
import sys
import types

import pytest
from gpu_fakes import fake_torch

from hvd_magic import gpu_compat, gpu_pinning


def fake_cuda(visible: int):
    calls = []
    return types.SimpleNamespace(set_device=calls.append, device_count=lambda: visible,
                                 calls=calls)


def test_the_local_rank_ordinal_maps_to_the_pinned_gpu_and_nothing_else():
    cuda = fake_cuda(visible=1)
    gpu_compat.patch(cuda, local_rank=2)
    for device in (2, "cuda:2", "2", types.SimpleNamespace(type="cuda", index=2), 0, 1, 3,
                   "cuda", types.SimpleNamespace(type="cpu", index=2), True):
        cuda.set_device(device)
    assert cuda.calls[:5] == [0, 0, 0, 0, 0]  # 2 in four spellings, then 0 itself
    assert cuda.calls[5:7] == [1, 3]  # other ordinals pass through (CUDA raises for them)
    assert cuda.calls[7] == "cuda" and cuda.calls[8].type == "cpu" and cuda.calls[9] is True
    gpu_compat.patch(cuda, local_rank=2)  # idempotent: not wrapped twice
    cuda.set_device(2)
    assert cuda.calls[-1] == 0 and len(cuda.calls) == 11


@pytest.mark.parametrize("local_rank, visible", [(0, 1), (2, 4)], ids=["rank-0", "not-narrowed"])
def test_an_existing_ordinal_is_used_as_given(local_rank, visible):
    cuda = fake_cuda(visible)
    gpu_compat.patch(cuda, local_rank)
    cuda.set_device(local_rank)
    assert cuda.calls == [local_rank]


def _python(code: str, env: dict) -> str:
    full = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", gpu_compat.PIN_ENV)}
    full.update(env)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=full)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


SET_DEVICE = "import torch; torch.cuda.set_device(2); torch.cuda.set_device(0); " \
             "print(torch.cuda.calls)"


def _pinned_env(tmp_path, narrowed=True, local_rank=2):
    env = {"PYTHONPATH": fake_torch(tmp_path / "fake"),
           gpu_compat.PIN_ENV: json.dumps({"device": "cuda:0", "narrowed": narrowed,
                                           "local_rank": local_rank})}
    return gpu_pinning.child_env(env)


def test_hvdrun_ranks_get_the_mapping_through_sitecustomize(tmp_path):
    env = _pinned_env(tmp_path)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == gpu_pinning.SITE_DIR
    assert _python(SET_DEVICE, env) == "[0, 0]"
    # no pin (or one that did not narrow): Python starts as usual, set_device untouched
    assert _python(SET_DEVICE, {"PYTHONPATH": env["PYTHONPATH"]}) == "[2, 0]"
    assert _python(SET_DEVICE, _pinned_env(tmp_path, narrowed=False)) == "[2, 0]"


def test_the_sitecustomize_we_hide_still_runs(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = 'yes'\n")
    env = _pinned_env(tmp_path)
    env["PYTHONPATH"] += os.pathsep + str(theirs)
    code = "import os, sys, torch; torch.cuda.set_device(2); " \
           "print(os.environ.get('THEIRS_RAN'), torch.cuda.calls, " \
           "sys.modules['sitecustomize'].__file__)"
    assert _python(code, env).split() == ["yes", "[0]", str(theirs / "sitecustomize.py")]


@pytest.mark.parametrize("torch_first", [False, True], ids=["before-import", "after-import"])
def test_in_process_install_before_or_after_torch_is_imported(tmp_path, torch_first):
    install = "from hvd_magic import gpu_compat; gpu_compat.install(3); "
    body = "import torch; torch.cuda.set_device(3); print(torch.cuda.calls)"
    code = ("import torch; " + install + body) if torch_first else (install + body)
    env = {"PYTHONPATH": os.pathsep.join([fake_torch(tmp_path / "fake"),
                                          os.path.dirname(os.path.dirname(gpu_compat.__file__))])}
    assert _python(code, env) == "[0]"


NAIVE_HOOK = """
import sys
class Naive:  # finds torch.cuda through the other finders, without a guard of its own
    def find_spec(self, name, path=None, target=None):
        if name != "torch.cuda":
            return None
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    return spec
sys.meta_path.insert(0, Naive())
"""


def test_another_import_hook_that_asks_the_other_finders_does_not_recurse(tmp_path):
    env = {"PYTHONPATH": os.pathsep.join([fake_torch(tmp_path / "fake"),
                                          os.path.dirname(os.path.dirname(gpu_compat.__file__))])}
    for order in ("hook first", "compat first"):
        install = "from hvd_magic import gpu_compat; gpu_compat.install(2)\n"
        setup = NAIVE_HOOK + install if order == "hook first" else install + NAIVE_HOOK
        code = setup + "import torch; torch.cuda.set_device(2); print(torch.cuda.calls)"
        assert _python(code, env) == "[0]", order
