"""The core formats text without iostreams (Note [No iostreams in the core], common/text.h).

On the lent H100 machine the core's first ``std::ostringstream << int`` crashed every rank of the
staged CUDA path (inside the locale's number formatting, sharing the process with torch 2.11,
CUDA 13 and NCCL); with iostreams gone from the core, tests/gpu passed there. This keeps them
gone: the built extension may not import any iostream or locale symbol.
"""
import re
import shutil
import subprocess

import engine_native._core as core

# std::basic_ostream / basic_ostringstream / basic_stringstream / std::locale and ios_base.
IOSTREAM_SYMBOL = re.compile(r"_ZNSo|_ZSt4cerr|_ZSt4cout|basic_ostringstream|"
                             r"basic_stringstream|_ZNSt6locale|_ZNSt8ios_base|_ZNKSt6locale")


def test_the_core_imports_no_iostream_or_locale_symbol():
    nm = shutil.which("nm")
    assert nm, "nm (binutils) is needed to read the extension's symbols"
    undefined = subprocess.run([nm, "-D", "--undefined-only", core.__file__], check=True,
                               capture_output=True, text=True).stdout.split()
    found = sorted({s for s in undefined if IOSTREAM_SYMBOL.search(s)})
    assert not found, f"{core.__file__} uses iostreams again: {found[:10]}"
