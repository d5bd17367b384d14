"""The package's shape stays honest: no import cycle, no module-level mutable registry or singleton.

Both read the source (ast), so they see every import, including the ones inside functions that
run late: a cycle through a lazy import is still a cycle in the design. Imports under
`if TYPE_CHECKING:` never run and are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "workbench"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, tuple[Path, ast.Module]]:
    return {module_name(p): (p, ast.parse(p.read_text(), str(p))) for p in sorted(PKG.rglob("*.py"))}


def _type_checking_blocks(tree: ast.AST) -> set[int]:
    """ids of the statements that only run for a type checker."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return out


def imports(name: str, path: Path, tree: ast.Module, known: set[str]) -> set[str]:
    """The workbench modules `name` imports (a package import counts as its __init__; `from . import x` as x)."""
    skip = _type_checking_blocks(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # `from pkg import mod` depends on that module; `from pkg import name` on pkg itself
            subs = [f"{mod}.{a.name}" for a in node.names]
            targets = [t for t in subs if t in known] + ([mod] if any(t not in known for t in subs) else [])
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    # only what a module imports itself: that importing a.b.c first runs a/__init__ is how Python
    # loads packages (and a package re-exporting its modules is its public face), not a dependency
    return {name: imports(name, path, tree, known) for name, (path, tree) in mods.items()}


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `g` (as a path that returns to its start), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(g.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(g):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_import_graph_has_no_cycle():
    g = graph()
    assert len(g) > 40 and g["workbench.host"] >= {"workbench.brain", "workbench.log", "workbench.plugins"}
    cycle = find_cycle(g)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_dependencies_point_one_way():
    """server -> brain -> {log, hands, models, memory}; hands never import the brain (DESIGN.md)."""
    g = graph()
    for name, deps in g.items():
        if name.startswith("workbench.hands"):
            assert not any(d.startswith(("workbench.brain", "workbench.server", "workbench.host", "workbench.cli"))
                           for d in deps), (name, deps)
        if name.startswith(("workbench.log", "workbench.egress")):
            assert not any(d.startswith(("workbench.brain", "workbench.hands", "workbench.server", "workbench.host",
                                         "workbench.memory")) for d in deps), (name, deps)
        if name.startswith("workbench.brain"):
            assert not any(d.startswith(("workbench.server", "workbench.host", "workbench.cli", "workbench.memory"))
                           for d in deps), (name, deps)
    assert g["workbench.config"] <= {"workbench.errors", "workbench.strictnum", "workbench"}  # leaves
    assert g["workbench.strictnum"] <= {"workbench"}


MUTATORS = {"append", "extend", "insert", "update", "setdefault", "add", "pop", "popitem", "remove", "discard",
            "clear", "__setitem__"}
MUTABLE_CALLS = {"dict", "list", "set", "defaultdict", "OrderedDict", "deque", "Counter"}


def module_level_mutables(tree: ast.Module) -> dict[str, int]:
    """Names a module binds at its top level to a mutable container (a literal or a constructor call)."""
    out = {}
    for node in tree.body:
        targets, value = [], None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        mutable = isinstance(value, (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)) or (
            isinstance(value, ast.Call) and getattr(value.func, "id", getattr(value.func, "attr", None)) in MUTABLE_CALLS)
        if mutable:
            for t in targets:
                if isinstance(t, ast.Name) and t.id != "__all__":
                    out[t.id] = node.lineno
    return out


def test_no_module_level_mutable_registry_or_singleton():
    """Module state is read-only: registries and singletons belong to a host, never to a module."""
    problems = []
    for name, (path, tree) in modules().items():
        for fn in ast.walk(tree):
            if isinstance(fn, ast.Global):
                problems.append(f"{name}: `global {', '.join(fn.names)}` (state belongs to an object, not a module)")
        for var, line in module_level_mutables(tree).items():
            problems.append(f"{name}:{line}: {var} is a mutable container at module level; use a tuple, "
                            "frozenset or types.MappingProxyType, or keep it on an object")
    assert problems == []


def test_the_registry_check_catches_one():
    tree = ast.parse("TOOLS = {}\nNAMES = ('a',)\ndef f():\n    global X\n")
    assert set(module_level_mutables(tree)) == {"TOOLS"}


def test_launchers_are_used_through_their_protocol():
    """What the hands need of a launcher is in the `Launcher` protocol, which every launcher implements:
    no `getattr`/`hasattr` probe of a launcher for a feature it may lack."""
    problems = []
    for name, (path, tree) in modules().items():
        for call in ast.walk(tree):
            if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in ("getattr", "hasattr")
                    and call.args and "launcher" in ast.unparse(call.args[0])):
                problems.append(f"{name}:{call.lineno}: {ast.unparse(call)}")
    assert problems == []
