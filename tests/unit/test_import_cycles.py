"""No two modules of the project import each other, directly or round a longer loop, counting
the imports inside functions (a lazy import hides a cycle, it does not remove it). A package's
``__init__`` importing its own modules is not counted: that is how packages are built."""
import ast
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGES = {"engine_native": "engine_native", "hvd_magic": "hvd_magic",
            "hvd_magic.kernel": "kernel", "hvd_magic.widgets": "widgets"}


def _modules():
    """{module name: (path, is a package __init__)} of every Python file of the packages."""
    found = {}
    for package, folder in PACKAGES.items():
        top = os.path.join(REPO, folder)
        for d, dirs, files in os.walk(top):
            dirs[:] = [x for x in dirs if x not in ("csrc", "__pycache__")]
            for f in (f for f in files if f.endswith(".py")):
                rel = os.path.relpath(os.path.join(d, f), top)[:-3].split(os.sep)
                parts = rel[:-1] if rel[-1] == "__init__" else rel
                found[".".join([package] + parts)] = (os.path.join(d, f), rel[-1] == "__init__")
    return found


def _imports(name, path, is_package, modules):
    """Project modules ``name`` imports, anywhere in its body."""
    base = name if is_package else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                prefix = base.rsplit(".", node.level - 1)[0] if node.level > 1 else base
                target = prefix + ("." + node.module if node.module else "")
            out.update(f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target
                       for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    # Edges into a package's __init__ are the package's own business, not a module's.
    return {m for m in out if m in modules and m != name and not modules[m][1]}


def _cycle(graph):
    """One cycle of ``graph`` as a list of modules, or None."""
    state = {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt, path + [nxt])
                if found:
                    return found
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start, [start])
            if found:
                return found
    return None


def test_no_import_cycles():
    modules = _modules()
    assert "hvd_magic.widgets.snapshot" in modules and "hvd_magic.ranksetup" in modules
    graph = {n: _imports(n, p, pkg, modules) for n, (p, pkg) in modules.items()}
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
