"""A HOROVOD_* variable that nothing here reads is named once, at init (issue #35 item 8), and
the list of names read stays the names the sources read."""
import json
import os
import re
import subprocess
import sys

from engine_native import horovod_env

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_read_is_what_the_sources_read():
    quoted = re.compile(r"""["'](HOROVOD_[A-Z0-9_]+)["']""")
    found = set()
    for package in ("engine_native", "hvd_magic"):
        for folder, _, files in os.walk(os.path.join(REPO, package)):
            for name in files:
                if name.endswith((".py", ".cc", ".h")) and name != "horovod_env.py":
                    with open(os.path.join(folder, name), encoding="utf-8") as f:
                        found |= set(quoted.findall(f.read()))
    assert found == horovod_env.READ


def test_init_names_unread_variables_once():
    code = ("import warnings, engine_native as hvd\n"
            "warnings.simplefilter('always')\n"
            "with warnings.catch_warnings(record=True) as seen:\n"
            "    hvd.init(); hvd.shutdown(); hvd.init(); hvd.shutdown()\n"
            "import json\n"
            "print(json.dumps([str(w.message) for w in seen if 'ignores' in str(w.message)]))\n")
    env = dict(os.environ, HOROVOD_GPU_OPERATIONS="NCCL", HOROVOD_NUM_NCCL_STREAMS="2",
               HOROVOD_FUSION_THRESHOLD="1048576", HVD_SIZE="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    messages = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(messages) == 1, messages
    assert "HOROVOD_GPU_OPERATIONS, HOROVOD_NUM_NCCL_STREAMS" in messages[0]
    assert "HOROVOD_FUSION_THRESHOLD" not in messages[0]
