"""The kernelspec of the hvd cluster kernel: what it says, install, uninstall, and the CLI.

``python -m hvd_magic.kernel install [--user|--sys-prefix|--prefix P] [--name NAME]
[-n N] [--launcher L] [--start-args ARGS] [--env KEY=VALUE ...]`` writes a kernelspec that
starts :class:`hvd_magic.kernel.kernel.HvdKernel` with this Python, and puts the cluster's size
and launcher in its ``env``; ``jupyter kernelspec list`` lists it.
``python -m hvd_magic.kernel uninstall [--name NAME] [--user|--sys-prefix|--prefix P]`` removes
it (only a kernelspec of this kernel, never another one of that name).

The kernel reads these once, when it starts its cluster (:func:`start_line`):

``HVD_KERNEL_NP``
    number of ranks (default 4, as ``%hvd_start``);
``HVD_KERNEL_LAUNCHER``
    ipyparallel engine launcher: ``mpi`` (default), ``local``, ``slurm``, ...;
``HVD_KERNEL_START_ARGS``
    more ``%hvd_start`` options, e.g. ``--gpus none --timeout 120 --env HVD_LOG=info``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import tempfile

DEFAULT_NAME = "hvd-cluster"
DISPLAY_NAME = "Python 3 (hvd cluster)"
MODULE = "hvd_magic.kernel"
ENV_NP, ENV_LAUNCHER, ENV_START_ARGS = "HVD_KERNEL_NP", "HVD_KERNEL_LAUNCHER", \
    "HVD_KERNEL_START_ARGS"
DEFAULT_NP, DEFAULT_LAUNCHER = 4, "mpi"


def start_line(env=None) -> str:
    """The ``%hvd_start`` arguments the kernel starts its cluster with, from ``env``.

    Raises ValueError naming the variable when a value is unusable.
    """
    env = os.environ if env is None else env
    raw_np = env.get(ENV_NP, "").strip() or str(DEFAULT_NP)
    try:
        n = int(raw_np)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{ENV_NP}={raw_np!r}: expected a number of ranks >= 1 (fix the "
                         f"kernelspec with python -m {MODULE} install -n N, or start the "
                         f"cluster yourself with %hvd_start -n N)")
    launcher = env.get(ENV_LAUNCHER, "").strip() or DEFAULT_LAUNCHER
    extra = env.get(ENV_START_ARGS, "").strip()
    return f"-n {n} --launcher {shlex.quote(launcher)}" + (f" {extra}" if extra else "")


def kernel_dict(n: int = DEFAULT_NP, launcher: str = DEFAULT_LAUNCHER, start_args: str = "",
                env: dict | None = None, display_name: str = DISPLAY_NAME,
                executable: str | None = None) -> dict:
    """The content of ``kernel.json``."""
    spec_env = {ENV_NP: str(n), ENV_LAUNCHER: launcher}
    if start_args:
        spec_env[ENV_START_ARGS] = start_args
    spec_env.update(env or {})
    return {
        "argv": [executable or sys.executable, "-m", MODULE, "-f", "{connection_file}"],
        "display_name": display_name,
        "language": "python",
        "interrupt_mode": "signal",
        "env": spec_env,
        # the debugger would step through the driver, never through the ranks' code
        "metadata": {"debugger": False, "hvd_magic": {"np": n, "launcher": launcher}},
    }


def _kernels_dir(user: bool, prefix: str | None) -> str | None:
    """The kernels folder a location option names (None: search every Jupyter path)."""
    if prefix:
        return os.path.join(os.path.abspath(prefix), "share", "jupyter", "kernels")
    if user:
        from jupyter_core.paths import jupyter_data_dir
        return os.path.join(jupyter_data_dir(), "kernels")
    return None


def install(name: str = DEFAULT_NAME, user: bool = True, prefix: str | None = None,
            n: int = DEFAULT_NP, launcher: str = DEFAULT_LAUNCHER, start_args: str = "",
            env: dict | None = None, display_name: str = DISPLAY_NAME) -> str:
    """Install the kernelspec; returns the folder it was written to.

    Parameters
    ----------
    name : str
        Kernelspec name (letters, digits, ``.``, ``_``, ``-``).
    user : bool
        Into the user's Jupyter data folder (ignored when ``prefix`` is given).
    prefix : str, optional
        Into ``PREFIX/share/jupyter/kernels`` (``sys.prefix`` for a virtual environment).
    n, launcher, start_args, env
        Cluster size, engine launcher, more ``%hvd_start`` options, more environment.
    """
    from jupyter_client.kernelspec import KernelSpecManager

    if n < 1:
        raise ValueError(f"install: -n {n}: need at least one rank")
    spec = kernel_dict(n, launcher, start_args, env, display_name)
    with tempfile.TemporaryDirectory(prefix="hvd-kernelspec-") as tmp:
        src = os.path.join(tmp, name)
        _copy_logos(src)
        with open(os.path.join(src, "kernel.json"), "w") as f:
            json.dump(spec, f, indent=1)
        return KernelSpecManager().install_kernel_spec(
            src, kernel_name=name, user=user and not prefix, prefix=prefix)


def _copy_logos(dest: str) -> None:
    """ipykernel's Python logos, so the launcher shows a Python icon."""
    try:
        from ipykernel.kernelspec import RESOURCES
        shutil.copytree(RESOURCES, dest)
    except (ImportError, OSError):
        os.makedirs(dest, exist_ok=True)


def uninstall(name: str = DEFAULT_NAME, user: bool = False, prefix: str | None = None) -> str:
    """Remove the kernelspec ``name`` (from the named location, else the first one found);
    returns the folder removed. Raises ValueError when there is none or it is not this
    kernel's."""
    folder = _kernels_dir(user, prefix)
    if folder is not None:
        path = os.path.join(folder, name)
    else:
        from jupyter_client.kernelspec import KernelSpecManager
        path = KernelSpecManager().find_kernel_specs().get(name, "")
    spec_file = os.path.join(path, "kernel.json") if path else ""
    if not spec_file or not os.path.isfile(spec_file):
        raise ValueError(f"uninstall: no kernelspec named {name!r}"
                         + (f" in {folder}" if folder else "") + " (see jupyter kernelspec list)")
    with open(spec_file) as f:
        argv = json.load(f).get("argv") or []
    if MODULE not in argv:
        raise ValueError(f"uninstall: the kernelspec {name!r} in {path} is not the hvd cluster "
                         f"kernel; remove it with jupyter kernelspec remove {name}")
    shutil.rmtree(path)
    return path


def _env_pair(text: str) -> tuple[str, str]:
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise argparse.ArgumentTypeError(f"--env {text!r}: expected KEY=VALUE")
    return key, value


def _location(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true",
                       help="the user's Jupyter data folder (install's default)")
    where.add_argument("--sys-prefix", action="store_true",
                       help="this Python's prefix (a virtual environment or conda env)")
    where.add_argument("--prefix", metavar="P", help="P/share/jupyter/kernels")
    parser.add_argument("--name", default=DEFAULT_NAME,
                        help=f"kernelspec name (default {DEFAULT_NAME})")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}",
                                description=f"Install the Jupyter kernel '{DISPLAY_NAME}': "
                                            "every cell runs on all ranks of a cluster.")
    sub = p.add_subparsers(dest="command", required=True)
    inst = sub.add_parser("install", help="install the kernelspec")
    _location(inst)
    inst.add_argument("--display-name", default=DISPLAY_NAME)
    inst.add_argument("-n", "--np", dest="n", type=int, default=DEFAULT_NP,
                      help=f"number of ranks (default {DEFAULT_NP})")
    inst.add_argument("--launcher", default=DEFAULT_LAUNCHER,
                      help="engine launcher: mpi (default), local, slurm, pbs, ssh, ...")
    inst.add_argument("--start-args", default="", metavar="ARGS",
                      help="more %%hvd_start options, e.g. --start-args='--gpus none "
                           "--timeout 120'")
    inst.add_argument("--env", action="append", type=_env_pair, metavar="KEY=VALUE",
                      help="environment variable for the kernel and its ranks (repeatable)")
    uninst = sub.add_parser("uninstall", help="remove the kernelspec")
    _location(uninst)
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    prefix = sys.prefix if args.sys_prefix else args.prefix
    try:
        if args.command == "install":
            path = install(args.name, user=True, prefix=prefix, n=args.n,
                           launcher=args.launcher, start_args=args.start_args,
                           env=dict(args.env or []), display_name=args.display_name)
            print(f"Installed kernelspec {args.name} ({args.display_name}, {args.n} ranks, "
                  f"{args.launcher} launcher) in {path}")
        else:
            path = uninstall(args.name, user=args.user, prefix=prefix)
            print(f"Removed kernelspec {args.name} from {path}")
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
