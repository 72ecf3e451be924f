"""The tests' HVD_TEST_* fault switches (forced probe failures, a delayed read, a small cache
bound) exist only in the test build of the core (common/test_switch.h, issue #35 item 4): a
core built without HVD_TEST_SWITCHES=1, as every wheel and a plain `pip install .` are, holds
no switch name at all, so no environment variable can change a shipped core's behaviour."""
import os
import re
import subprocess
import sysconfig

from native.build_testhooks import CSRC, _compiler

import engine_native
from engine_native import _core

SWITCH_LITERAL = re.compile(rb'"HVD_TEST_')


def _sources():
    for folder, _, files in os.walk(CSRC):
        for name in files:
            if name.endswith((".cc", ".h")):
                path = os.path.join(folder, name)
                with open(path, "rb") as fh:
                    yield path, fh.read()


def _switch_users():
    return sorted(p for p, text in _sources() if b"HVD_TEST_SWITCH(" in text and
                  not p.endswith("test_switch.h"))


def test_no_source_reads_a_switch_around_the_macro():
    """Every switch goes through HVD_TEST_SWITCH: a getenv("HVD_TEST_...") elsewhere would
    stay in a release build."""
    direct = [os.path.relpath(p, CSRC) for p, text in _sources()
              if SWITCH_LITERAL.search(text) and not p.endswith("test_switch.h")]
    assert direct == []
    assert _switch_users(), "no source uses HVD_TEST_SWITCH: the scan below checks nothing"


def _object_bytes(src, tmp_path, *defines):
    obj = tmp_path / (os.path.basename(src) + "".join(defines) + ".o")
    subprocess.run(_compiler() + ["-std=c++17", "-O0", "-c", src, "-o", str(obj), "-I" + CSRC,
                                  "-I" + sysconfig.get_paths()["include"], *defines],
                   check=True, capture_output=True, timeout=240)
    return obj.read_bytes()


def test_a_build_without_the_switches_holds_no_switch_name(tmp_path):
    users = _switch_users()
    for src in users:
        assert b"HVD_TEST_" not in _object_bytes(src, tmp_path), os.path.relpath(src, CSRC)
    # and the test build does hold them (the check above can fail)
    assert b"HVD_TEST_" in _object_bytes(users[0], tmp_path, "-DHVD_TEST_SWITCHES")


def test_the_suites_core_is_the_test_build():
    """./dev.sh builds with HVD_TEST_SWITCHES=1; the harness refuses a switch otherwise."""
    assert _core.TEST_SWITCHES == 1, engine_native.__file__
