"""The long fuzz run: every decoder of bytes from another process, C++ under ASan + UBSan
(fuzz_decoders) and Python (py_fuzz), 100,000 inputs each unless told otherwise.

    python tests/fuzz/run.py [--inputs N] [--seed S]

Prints both tables (``decoder | inputs | accepted | rejected | crashes | seconds``) and exits
non-zero when any input crashed, broke a decoder's contract or hung; the reproducer is printed
above the table. CI runs a bounded pass of the same (tests/fuzz/test_fuzz_*.py); the figures
of this run go in the issue's note.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    sys.path.insert(0, HERE)
    import build_fuzzer

    started = time.monotonic()
    binary = build_fuzzer.build()
    built = time.monotonic()
    print(f"fuzz_decoders (ASan + UBSan): {binary}, ready in {built - started:.0f} s", flush=True)
    cpp = subprocess.run([binary, "--inputs", str(args.inputs), "--seed", str(args.seed),
                          "--seeds", build_fuzzer.SEEDS], check=False)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [REPO] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    print("\nPython decoders", flush=True)
    py = subprocess.run([sys.executable, os.path.join(HERE, "py_fuzz.py"), "--inputs",
                         str(args.inputs), "--seed", str(args.seed)], env=env, check=False)
    print(f"\n{time.monotonic() - started:.0f} s in all; C++ exit {cpp.returncode}, "
          f"Python exit {py.returncode}")
    return 0 if cpp.returncode == 0 and py.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
