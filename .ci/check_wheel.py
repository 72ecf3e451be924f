"""What a wheel must carry, checked right after .ci/build-wheel.sh builds it: the core, the
notebooks the demo runs, the version of engine_native/_version.py; and what it must not: the
C++ sources, the tests' fault switches (a switch name in the library means a test build).

    python .ci/check_wheel.py dist/hvd_magic-*.whl
"""
import re
import sys
import zipfile

NEEDED = ("engine_native/__init__.py", "engine_native/_version.py", "engine_native/_core.pyi",
          "hvd_magic/demo.py",
          "hvd_magic/doctor.py", "hvd_magic/kernel/kernelspec.py", "hvd_magic/widgets/view.py",
          "hvd_magic/notebooks/quickstart.ipynb")


def problems(path: str) -> list:
    names = zipfile.ZipFile(path).namelist()
    out = [f"missing {n}" for n in NEEDED if n not in names]
    cores = [n for n in names if re.fullmatch(r"engine_native/_core\..*\.so", n)]
    if len(cores) != 1:
        out.append(f"expected one engine_native/_core*.so, found {cores}")
    sources = [n for n in names if "/csrc/" in n]
    if sources:
        out.append(f"has {len(sources)} entries under csrc/, e.g. {sources[-1]} (the C++ "
                   f"sources belong in the sdist)")
    out += [f"generic top-level name {n}" for n in names
            if n.split("/")[0] in ("kernel", "widgets", "notebooks", "tests")]
    with zipfile.ZipFile(path) as wheel:
        if cores and b"HVD_TEST_" in wheel.read(cores[0]):
            out.append("the core has the tests' fault switches (built with HVD_TEST_SWITCHES=1)")
        if "engine_native/_version.py" in names:
            version = re.search(r'__version__ = "([^"]+)"',
                                wheel.read("engine_native/_version.py").decode()).group(1)
            if f"hvd_magic-{version}-" not in path.rsplit("/", 1)[-1]:
                out.append(f"the file name does not carry the version {version}")
    return out


if __name__ == "__main__":
    found = [f"{p}: {what}" for p in sys.argv[1:] for what in problems(p)]
    print("\n".join(found) or f"check_wheel: {len(sys.argv) - 1} wheel(s) carry what they must")
    sys.exit(1 if found else 0)
