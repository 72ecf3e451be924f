"""Sending functions to ranks with cloudpickle, and saying exactly what cannot be sent.

The most reported HorovodRunner error is a pickling failure with a message that names a type
deep inside cloudpickle ("cannot pickle '_thread.lock' object") but not which of the user's
variables holds it. :func:`dumps` pickles; when that fails, :func:`find_culprit` walks what
cloudpickle would walk (a function's closure cells, the globals its code names, its defaults;
a bound method's instance; a partial's parts; container items; object attributes), trying each
part alone, down to the innermost part that fails, and :class:`UnpicklableError` names that
path ("main → global 'log' → attribute 'stream'") with a fix for its kind.
"""

from __future__ import annotations

import functools
import io
import pickle
import socket
import threading
import types
from typing import Any

import cloudpickle

__all__ = ["UnpicklableError", "dumps", "dumps_call", "find_culprit", "loads", "loads_call"]

# cloudpickle (>= 3.1) names every code object it sends by value "<dynamic-code>", so a rank's
# traceback would show neither the file nor the source lines of the user's function.
# dumps_call sends the real file name along and loads_call puts it back.
_DYNAMIC_FILE = "<dynamic-code>"

_MAX_DEPTH = 8
_MAX_CHILDREN = 256


class UnpicklableError(pickle.PicklingError):
    """``what`` cannot be pickled; ``path`` lists the labels down to ``culprit``."""

    def __init__(self, message: str, path: list, culprit: Any):
        super().__init__(message)
        self.path = path
        self.culprit = culprit


def loads(data: bytes) -> Any:
    return cloudpickle.loads(data)


def dumps(obj: Any, what: str, root: str = "the function") -> bytes:
    """cloudpickle ``obj``; on failure raise :class:`UnpicklableError` naming the culprit.

    ``what`` names the operation for the message (``"HorovodRunner.run(main)"``), ``root``
    the object's label at the start of the path (``"main"``).
    """
    try:
        return cloudpickle.dumps(obj)
    except Exception as exc:  # cloudpickle raises TypeError, PicklingError, RuntimeError, ...
        path = find_culprit(obj, root)
        raise UnpicklableError(_message(what, root, path, exc), [p[0] for p in path],
                               path[-1][1] if path else obj) from exc


def dumps_call(fn: Any, args: tuple, kwargs: dict, what: str) -> bytes:
    """cloudpickle a call of ``fn`` for :func:`loads_call`; a failure names the argument or the
    function's part."""
    code = getattr(fn, "__code__", None)
    payload = (fn, args, kwargs, code.co_filename if isinstance(code, types.CodeType) else None)
    try:
        return cloudpickle.dumps(payload)
    except Exception:
        pass
    name = getattr(fn, "__name__", None) or "the function"
    parts = [(name, fn)] + [(f"argument #{i + 1}", a) for i, a in enumerate(args)] + [
        (f"keyword argument '{k}'", v) for k, v in kwargs.items()]
    for root, part in parts:
        dumps(part, what, root)
    return cloudpickle.dumps(payload)  # raises as is if only the whole fails


def _refiled(code: types.CodeType, filename: str) -> types.CodeType:
    """``code`` and the functions defined in it, with ``filename`` for the dynamic one."""
    consts = tuple(_refiled(c, filename) if isinstance(c, types.CodeType) else c
                   for c in code.co_consts)
    if code.co_filename != _DYNAMIC_FILE:
        return code.replace(co_consts=consts) if consts != code.co_consts else code
    return code.replace(co_filename=filename, co_consts=consts)


def loads_call(data: bytes) -> tuple:
    """``(fn, args, kwargs)`` from :func:`dumps_call`, the function's file name restored."""
    fn, args, kwargs, filename = cloudpickle.loads(data)
    if filename and isinstance(fn, types.FunctionType):
        fn.__code__ = _refiled(fn.__code__, filename)
    return fn, args, kwargs


def _picklable(obj: Any) -> bool:
    try:
        cloudpickle.dumps(obj)
        return True
    except Exception:
        return False


def _code_names(code: types.CodeType) -> set:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _children(obj: Any) -> list:
    """(label, part) pairs that cloudpickle pickles to pickle ``obj``."""
    if isinstance(obj, types.FunctionType):
        parts = []
        code = obj.__code__
        for name, cell in zip(code.co_freevars, obj.__closure__ or ()):
            try:
                parts.append((f"closure variable '{name}'", cell.cell_contents))
            except ValueError:  # empty cell
                pass
        for name in sorted(_code_names(code)):
            if name in obj.__globals__:
                parts.append((f"global '{name}'", obj.__globals__[name]))
        for i, value in enumerate(obj.__defaults__ or ()):
            parts.append((f"default argument #{i + 1}", value))
        for name, value in (obj.__kwdefaults__ or {}).items():
            parts.append((f"default of '{name}'", value))
        return parts
    if isinstance(obj, types.MethodType):
        return [("its instance (self)", obj.__self__), ("its function", obj.__func__)]
    if isinstance(obj, functools.partial):
        return ([("partial's function", obj.func)]
                + [(f"partial's argument #{i + 1}", a) for i, a in enumerate(obj.args)]
                + [(f"partial's keyword '{k}'", v) for k, v in obj.keywords.items()])
    if isinstance(obj, dict):
        return [(f"[{k!r}]", v) for k, v in list(obj.items())[:_MAX_CHILDREN]]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [(f"[{i}]", v) for i, v in enumerate(list(obj)[:_MAX_CHILDREN])]
    if isinstance(obj, (type, types.ModuleType)):
        return []
    state = getattr(obj, "__dict__", None)
    if isinstance(state, dict):
        return [(f"attribute '{k}'", v) for k, v in list(state.items())[:_MAX_CHILDREN]]
    return []


def find_culprit(obj: Any, root: str = "the object") -> list:
    """The path [(label, object), ...] from ``obj`` (first) to the innermost unpicklable part."""
    path = [(root, obj)]
    seen = {id(obj)}
    while len(path) < _MAX_DEPTH:
        for label, child in _children(path[-1][1]):
            if id(child) in seen or _picklable(child):
                continue
            seen.add(id(child))
            path.append((label, child))
            break
        else:
            break
    return path


def _type_name(obj: Any) -> str:
    cls = type(obj)
    return cls.__name__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _fix(culprit: Any, via_global: str | None) -> str:
    module = type(culprit).__module__ or ""
    if module.startswith(("pyspark", "py4j")):
        return ("Spark objects (SparkContext, SparkSession, DataFrame) live on the driver only: "
                "inside the function, read the data from storage (pass its path), or collect "
                "what you need into plain Python/NumPy objects first and pass those.")
    if isinstance(culprit, (io.IOBase, socket.socket)):
        kind = "file" if isinstance(culprit, io.IOBase) else "socket"
        return (f"a {kind} cannot travel to another process: open it inside the function "
                f"(pass its path or address as an argument instead).")
    if isinstance(culprit, (type(threading.Lock()), type(threading.RLock()), threading.Thread,
                            threading.Event, threading.Condition)):
        return ("locks and threads belong to this process: create them inside the function, "
                "or make the object that holds one without it (e.g. a logger: call "
                "logging.getLogger(...) inside the function).")
    if isinstance(culprit, types.GeneratorType):
        return ("generators cannot be pickled: turn it into a list, or create it inside the "
                "function.")
    where = f"the global '{via_global}'" if via_global else "it"
    return (f"create {where} inside the function instead of capturing it (import modules "
            "inside the function too), or pass the plain data it is built from (a path, a "
            "config dict, a NumPy array) as an argument.")


def _message(what: str, root: str, path: list, exc: BaseException) -> str:
    culprit = path[-1][1]
    chain = " → ".join(label for label, _ in path)
    globals_ = [label.split("'")[1] for label, _ in path if label.startswith("global '")]
    try:
        shown = repr(culprit)
    except Exception:
        shown = object.__repr__(culprit)
    if len(shown) > 120:
        shown = shown[:117] + "..."
    if len(path) == 1:
        head = (f"{what}: {root} ({_type_name(culprit)}: {shown}) cannot be pickled to send "
                "it to the ranks")
    else:
        head = (f"{what}: cannot pickle {root} to send it to the ranks, because of "
                f"{path[-1][0]} ({_type_name(culprit)}: {shown})")
    return (f"{head}.\n  path: {chain}\n  error: {type(exc).__name__}: {exc}\n"
            f"  fix: {_fix(culprit, globals_[-1] if globals_ else None)}")
