"""The package's shape stays honest: no import cycle, no module-level mutable registry or singleton.

Both read the source (ast), so they see every import, including the ones inside functions that
run late: a cycle through a lazy import is still a cycle in the design. Imports under
`if TYPE_CHECKING:` never run and are left out.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "workbench"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def _parsed() -> tuple[tuple[str, Path, ast.Module], ...]:
    return tuple((module_name(p), p, ast.parse(p.read_text(), str(p))) for p in sorted(PKG.rglob("*.py")))


def modules() -> dict[str, tuple[Path, ast.Module]]:
    """Every module of the package, parsed (once per run: the trees are only read)."""
    return {name: (p, tree) for name, p, tree in _parsed()}


def _type_checking_blocks(tree: ast.AST) -> set[int]:
    """ids of the statements that only run for a type checker."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return out


def import_statements(name: str, path: Path, tree: ast.Module) -> list[tuple[str, list[str], int]]:
    """Each import of module `name` that runs: (the module named, absolute; the names taken from it, none for a
    plain `import`; its line)."""
    skip = _type_checking_blocks(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: list[tuple[str, list[str], int]] = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append((mod, [a.name for a in node.names], node.lineno))
    return out


def imports(name: str, path: Path, tree: ast.Module, known: set[str]) -> set[str]:
    """The workbench modules `name` imports (a package import counts as its __init__; `from . import x` as x)."""
    out: set[str] = set()
    for mod, names, _ in import_statements(name, path, tree):
        if not names:
            targets = [mod]
        else:
            # `from pkg import mod` depends on that module; `from pkg import name` on pkg itself
            subs = [f"{mod}.{n}" for n in names]
            targets = [t for t in subs if t in known] + ([mod] if any(t not in known for t in subs) else [])
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


# -- the hands' rooms ---------------------------------------------------------------------------------------------

HANDS = "workbench.hands"
ROOMS = ("observing", "launching", "isolating")
# The hands' floors, from the ground: a module of the hands imports only hands modules of its own floor or
# below (docs/architecture.md). A room's modules are on its floor; its face too.
HANDS_FLOORS = (
    ("workbench.hands.observing",),  # a call's outputs, pure data: nothing else of the hands
    ("workbench.hands.base", "workbench.hands.files"),  # the protocols; the workspace's files
    ("workbench.hands.isolating",),  # what keeps a kernel in its place; never starts one
    ("workbench.hands.launching",),  # how kernels start, talk and end
    ("workbench.hands.kernel", "workbench.hands.replay", "workbench.hands.factory", "workbench.hands.verdict",
     "workbench.hands"),
)


def floor_of(module: str, package: str, floors: tuple[tuple[str, ...], ...]) -> int | None:
    """The floor of a module of `package` (None: not one of its modules, or on no floor)."""
    for n, floor in enumerate(floors):
        for place in floor:
            if module == place or (place != package and module.startswith(place + ".")):
                return n
    return None


def floor_problems(g: dict[str, set[str]], package: str = HANDS, floors: tuple[tuple[str, ...], ...] = HANDS_FLOORS,
                   table: str = "HANDS_FLOORS") -> list[str]:
    """Modules of `package` that import one of its modules above their floor, or stand on no floor."""
    problems = []
    for name, deps in sorted(g.items()):
        if name != package and not name.startswith(package + "."):
            continue
        floor = floor_of(name, package, floors)
        if floor is None:
            problems.append(f"{name} is on no floor of {table}: put it on one")
            continue
        for d in sorted(deps):
            above = floor_of(d, package, floors)
            if above is not None and above > floor:
                problems.append(f"{name} (floor {floor}) imports {d} (floor {above}): {table} depend downward")
    return problems


def face_names(tree: ast.Module) -> set[str]:
    """What a package's face exports: its `__all__`."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return {ast.literal_eval(e) for e in node.value.elts}  # type: ignore[attr-defined]
    return set()


def room_reaches(mods: dict[str, tuple[Path, ast.Module]]) -> list[str]:
    """Imports outside the hands that reach past a room's face: a room's module, or a name its face does not export."""
    faces = {f"{HANDS}.{room}": face_names(mods[f"{HANDS}.{room}"][1]) for room in ROOMS if f"{HANDS}.{room}" in mods}
    problems = []
    for name, (path, tree) in sorted(mods.items()):
        if name == HANDS or name.startswith(HANDS + "."):
            continue
        for mod, names, line in import_statements(name, path, tree):
            face = next((f for f in faces if mod == f or mod.startswith(f + ".")), None)
            if face is None:
                continue
            if mod != face:
                problems.append(f"{name}:{line}: imports {mod}, inside a room: import it from {face}")
            elif missing := sorted(set(names) - faces[face]):
                problems.append(f"{name}:{line}: takes {', '.join(missing)} from {face}, whose face does not export it")
    return problems


def test_the_hands_rooms_depend_one_way():
    """observing is the ground floor; isolating never imports launching; launching never imports the hands above."""
    assert floor_problems(graph()) == []


def test_the_floor_check_catches_an_import_upward():
    g = {"workbench.hands.observing.fold": {"workbench.hands.launching.local", "workbench.hands.observing.clean"},
         "workbench.hands.isolating.quota": {"workbench.hands.base"},  # downward: fine
         "workbench.hands.newthing": set()}
    assert floor_problems(g) == [
        "workbench.hands.newthing is on no floor of HANDS_FLOORS: put it on one",
        "workbench.hands.observing.fold (floor 0) imports workbench.hands.launching.local (floor 3): HANDS_FLOORS "
        "depend downward",
    ]


def test_other_packages_reach_a_room_only_through_its_face():
    assert room_reaches(modules()) == []


def test_the_face_check_catches_a_reach_inside_a_room():
    mods = modules()
    source = ("from ..hands.observing.fold import Fold\n"
              "from ..hands.isolating import quota\n"
              "from ..hands.isolating import preflight\n"
              "from ..hands import files\n"
              "import workbench.hands.launching.local\n")
    mods["workbench.brain.intruder"] = (PKG / "brain" / "intruder.py", ast.parse(source))
    assert room_reaches(mods) == [
        "workbench.brain.intruder:1: imports workbench.hands.observing.fold, inside a room: import it from "
        "workbench.hands.observing",
        "workbench.brain.intruder:2: takes quota from workbench.hands.isolating, whose face does not export it",
        "workbench.brain.intruder:5: imports workbench.hands.launching.local, inside a room: import it from "
        "workbench.hands.launching",
    ]


# each protocol's package, the implementations nobody outside it may test for, and the name its values go by
PROTOCOLS = {
    "hands": (HANDS, ("KernelHands", "RefusedHands")),
    "log": ("workbench.log", ("DuckDBLog", "MemoryLog", "WriterLog")),
}


def _typed_any(node: ast.AST) -> tuple[str, str] | None:
    """(its kind, what it says) for a parameter or attribute called `hands` or `log` (or ending so) typed Any."""
    if isinstance(node, ast.arg) and node.annotation is not None:
        name, annotation = node.arg, node.annotation
    elif isinstance(node, ast.AnnAssign):
        name, annotation = ast.unparse(node.target).rpartition(".")[2], node.annotation
    else:
        return None
    typed = ast.unparse(annotation)
    for kind in PROTOCOLS:
        if (name == kind or name.endswith("_" + kind)) and "Any" in typed.replace("'", "").split(" | "):
            return kind, f"{name}: {typed}"
    return None


def protocol_probes(mods: dict[str, tuple[Path, ast.Module]]) -> list[str]:
    """Where a package outside the hands or the log asks what a session's hands or log are instead of using their
    protocols (`Hands`; `SessionLog`, `ManagedLog`, `SqlLog`): an isinstance on an implementation, a getattr/hasattr
    probe for a feature they may lack, or a value of either typed `Any`."""
    def theirs(module: str, kind: str) -> bool:
        return module == PROTOCOLS[kind][0] or module.startswith(PROTOCOLS[kind][0] + ".")

    problems = []
    for name, (_, tree) in sorted(mods.items()):
        for node in ast.walk(tree):
            if (typed := _typed_any(node)) is not None and not theirs(name, typed[0]):
                problems.append(f"{name}:{node.lineno}: {typed[1]}")
        for kind, (_package, implementations) in PROTOCOLS.items():
            if theirs(name, kind):
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
                    probed = ast.unparse(node.args[0]).rpartition(".")[2]
                    probe = node.func.id in ("getattr", "hasattr") and (probed == kind or probed.endswith("_" + kind))
                    downcast = node.func.id == "isinstance" and len(node.args) > 1 and any(
                        impl in ast.unparse(node.args[1]) for impl in implementations)
                    if probe or downcast:
                        problems.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    return sorted(problems, key=lambda p: (p.split(":")[0], int(p.split(":")[1])))


def test_hands_and_logs_are_used_through_their_protocols():
    """The workspace, its owner and freezing are in the `Hands` protocol, which every implementation subclasses; what
    a log offers is in its protocols (its file through `sql()`)."""
    assert protocol_probes(modules()) == []


def test_the_protocol_check_catches_a_probe_a_downcast_and_an_any():
    source = ("if isinstance(hands, KernelHands):\n    pass\n"
              "vault = getattr(host.hands, 'vault', None)\n"
              "ok = isinstance(hands, Hands) and getattr(self.host.log, 'path', None)\n"
              "def f(log: Any, hands: Hands, session_log: 'Any | None' = None) -> None:\n    pass\n"
              "duck = isinstance(lg, DuckDBLog)\n"
              "class C:\n    hands: Any\n    logger: Any\n")
    mods = {"workbench.delegate.intruder": (PKG / "delegate" / "intruder.py", ast.parse(source)),
            "workbench.hands.factory": (PKG / "hands" / "factory.py", ast.parse(source)),  # theirs, but for the log
            "workbench.log.writer": (PKG / "log" / "writer.py", ast.parse("x = isinstance(lg, DuckDBLog)\n"))}
    assert protocol_probes(mods) == [
        "workbench.delegate.intruder:1: isinstance(hands, KernelHands)",
        "workbench.delegate.intruder:3: getattr(host.hands, 'vault', None)",
        "workbench.delegate.intruder:4: getattr(self.host.log, 'path', None)",
        "workbench.delegate.intruder:5: log: Any",
        "workbench.delegate.intruder:5: session_log: 'Any | None'",
        "workbench.delegate.intruder:7: isinstance(lg, DuckDBLog)",
        "workbench.delegate.intruder:9: hands: Any",
        "workbench.hands.factory:4: getattr(self.host.log, 'path', None)",
        "workbench.hands.factory:5: log: Any",
        "workbench.hands.factory:5: session_log: 'Any | None'",
        "workbench.hands.factory:7: isinstance(lg, DuckDBLog)",
    ]


# -- one service, two transports ----------------------------------------------------------------------------------

FACES = ("workbench.cli", "workbench.client")  # the faces over the service (workbench/service)
# where a face picks its transport: the CLI builds the in-process one over a host of its --db there; the console
# is the CommandContext a plugin's command gets (its host), until plugin commands run on the service too
TRANSPORT_PICKERS = ("workbench.cli.service", "workbench.cli.console")
HTTP_LIBRARIES = ("httpx", "websocket", "tornado.httpclient", "tornado.websocket", "requests", "urllib.request", "aiohttp")
IN_PROCESS = ("workbench.brain", "workbench.service.local")  # what a Host holds, and the in-process transport
# the core's routes (docs/api.md): a face that names one writes an operation over REST a second time
CORE_PATHS = ("/workbench/api", "/sessions", "/search", "/query", "/models", "/status")


def _is_face(name: str) -> bool:
    return any(name == f or name.startswith(f + ".") for f in FACES)


def _path_literal(node: ast.AST) -> str | None:
    """The text a string constant or an f-string starts with (None for anything else)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return str(node.values[0].value)
    return None


def second_implementations(mods: dict[str, tuple[Path, ast.Module]]) -> list[str]:
    """Where a face (the CLI, the notebook client) writes an operation of the service again: a core REST path, an
    HTTP or websocket library, or a Host (outside the module that picks the transport)."""
    problems = []
    for name, (path, tree) in sorted(mods.items()):
        if not _is_face(name):
            continue
        for mod, names, line in import_statements(name, path, tree):
            # the host module also loads plugins and says the version: only its Host is a host
            hosted = any(mod == m or mod.startswith(m + ".") for m in IN_PROCESS) or (
                mod == "workbench.host" and (not names or "Host" in names))
            if any(mod == lib or mod.startswith(lib + ".") for lib in HTTP_LIBRARIES):
                problems.append(f"{name}:{line}: imports {mod}: HTTP belongs to the REST transport (workbench.service.rest)")
            elif name not in TRANSPORT_PICKERS and hosted:
                problems.append(f"{name}:{line}: imports {mod}: a face runs operations on the service, not on a Host")
        parts = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
        for node in ast.walk(tree):
            text = _path_literal(node) if id(node) not in parts else None
            if text is not None and text.startswith(CORE_PATHS):
                problems.append(f"{name}:{node.lineno}: {text!r} names a route of the API: call the service instead")
    return problems


def test_the_faces_write_no_operation_a_second_time():
    """The CLI and the notebook client run every operation through the service (workbench/service): no REST path,
    no HTTP, no Host of their own (docs/architecture.md, "One service, two transports")."""
    assert second_implementations(modules()) == []


def test_the_second_implementation_check_catches_one():
    source = ("import httpx\n"
              "from ..host import Host\n"
              "from ..service.local import Local\n"
              "from ..service import Blocking\n"
              "def usage(client, sid):\n"
              "    return client._call('GET', f'/sessions/{sid}/usage')\n"
              "NOTE = 'sessions are listed by /sessions'\n")
    mods = {"workbench.cli.intruder": (PKG / "cli" / "intruder.py", ast.parse(source)),
            "workbench.server.handlers": (PKG / "server" / "handlers.py", ast.parse(source))}  # not a face: its own
    assert second_implementations(mods) == [
        "workbench.cli.intruder:1: imports httpx: HTTP belongs to the REST transport (workbench.service.rest)",
        "workbench.cli.intruder:2: imports workbench.host: a face runs operations on the service, not on a Host",
        "workbench.cli.intruder:3: imports workbench.service.local: a face runs operations on the service, not on a Host",
        "workbench.cli.intruder:6: '/sessions/' names a route of the API: call the service instead",
    ]


# -- the core under its faces -------------------------------------------------------------------------------------

# the faces people use: the server's REST API, the CLI, the notebook client (the memory plugin's review panels are
# its own, under workbench/memory)
ALL_FACES = ("workbench.server", "workbench.cli", "workbench.client")
# where the package is entered: `import workbench` offers the notebook client and the server extension's hooks,
# `python -m workbench` is the CLI
ENTRY_POINTS = ("workbench", "workbench.__main__")
# the built-in plugins: they import nothing of the core but the plugin surface (workbench.plugins), a stricter rule
# than this one (test_plugins_import_only_the_plugin_surface)
PLUGIN_PACKAGES = ("workbench.memory", "workbench.evals", "workbench.delegate")
# the plugin surface's face parts: they hand a plugin the server's handler, the CLI's console and the notebook
# client to build its routes, commands and panels on; only plugins import them, and the core never does
PLUGIN_FACE_PARTS = ("workbench.plugins.web", "workbench.plugins.cli", "workbench.plugins.client")


def _under(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def faces_imported_by_the_core(g: dict[str, set[str]]) -> list[str]:
    """Modules under the faces (the service, the host, the brain, the log, the hands, the checks, ...) that import
    a face, even lazily: what both faces need (a check, an operation) belongs under both."""
    return [f"{name} imports {d}: the core is under its faces; move what both need below them"
            for name, deps in sorted(g.items())
            if not _under(name, ALL_FACES + PLUGIN_FACE_PARTS + PLUGIN_PACKAGES) and name not in ENTRY_POINTS
            for d in sorted(deps) if _under(d, ALL_FACES)]


def test_the_core_imports_no_face():
    """The in-process service checks a new session as the server does by calling the same code under both
    (workbench/checks.py), not by importing the server's request bodies."""
    assert faces_imported_by_the_core(graph()) == []


def test_the_face_import_check_catches_one():
    g = {"workbench.service.local": {"workbench.server.bodies", "workbench.host"},
         "workbench.server.handlers": {"workbench.service.local"}, "workbench": {"workbench.client"},
         "workbench.brain.loop": {"workbench.cli.console"}}
    assert faces_imported_by_the_core(g) == [
        "workbench.brain.loop imports workbench.cli.console: the core is under its faces; move what both need below them",
        "workbench.service.local imports workbench.server.bodies: the core is under its faces; move what both need "
        "below them"]


# -- plugins on their surface -------------------------------------------------------------------------------------

def plugin_imports_beyond_the_surface(g: dict[str, set[str]], plugins: tuple[str, ...] = PLUGIN_PACKAGES) -> list[str]:
    """Modules of a plugin that import the core beyond `workbench.plugins` (or another plugin): what a plugin may
    use is the surface docs/plugins.md documents, so that the core's rooms can move without breaking one."""
    out = []
    for name, deps in sorted(g.items()):
        own = next((p for p in plugins if _under(name, (p,))), None)
        if own is None:
            continue
        out += [f"{name} imports {d}: a plugin imports only workbench.plugins (add what it needs to the surface)"
                for d in sorted(deps) if not _under(d, (own, "workbench.plugins"))]
    return out


def test_plugins_import_only_the_plugin_surface():
    assert plugin_imports_beyond_the_surface(graph()) == []


def core_imports_of_plugins(g: dict[str, set[str]]) -> list[str]:
    """Modules outside the plugins that import one, even lazily: the host loads plugins by name, and what a plugin
    adds to a face (a command, a route, a client method) comes through its hooks."""
    return [f"{name} imports {d}: the core reaches a plugin only through its hooks" for name, deps in sorted(g.items())
            if not _under(name, PLUGIN_PACKAGES) for d in sorted(deps) if _under(d, PLUGIN_PACKAGES)]


def test_the_core_imports_no_plugin():
    """The notebook client's eval methods were written in the client over the evals plugin's modules; they are the
    plugin's own now (Plugin.client())."""
    assert core_imports_of_plugins(graph()) == []


def test_the_plugin_import_check_catches_one():
    g = {"workbench.client.api": {"workbench.evals.results", "workbench.plugins"},
         "workbench.evals.client": {"workbench.evals.results"}}
    assert core_imports_of_plugins(g) == [
        "workbench.client.api imports workbench.evals.results: the core reaches a plugin only through its hooks"]


def test_the_plugin_surface_check_catches_one():
    g = {"workbench.memory.cli": {"workbench.cli.console", "workbench.plugins.cli", "workbench.memory.store"},
         "workbench.delegate.run": {"workbench.evals.verify", "workbench.plugins.hands"},
         "workbench.evals.plugin": {"workbench.log"}, "workbench.cli.main": {"workbench.plugins"}}
    assert plugin_imports_beyond_the_surface(g) == [
        "workbench.delegate.run imports workbench.evals.verify: a plugin imports only workbench.plugins (add what it "
        "needs to the surface)",
        "workbench.evals.plugin imports workbench.log: a plugin imports only workbench.plugins (add what it needs to "
        "the surface)",
        "workbench.memory.cli imports workbench.cli.console: a plugin imports only workbench.plugins (add what it "
        "needs to the surface)"]


def test_the_example_plugin_imports_only_the_plugin_surface():
    """examples/echo_plugin is built from docs/plugins.md alone: what it imports of workbench is the surface."""
    path = PKG.parent / "examples" / "echo_plugin" / "echo_plugin.py"
    tree = ast.parse(path.read_text(), str(path))
    taken = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    taken += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    ours = [m for m in taken if m == "workbench" or m.startswith("workbench.")]
    assert ours and all(m == "workbench.plugins" or m.startswith("workbench.plugins.") for m in ours), ours


# -- the test tree mirrors the package ----------------------------------------------------------------------------

TESTS = PKG.parent / "tests"
# the tests of the repository as a whole (its shape, its docs, the test run's own order and leak check); every other
# test file sits in the folder of the package it tests (tests/brain for workbench/brain, tests/core for the modules
# at the top of workbench/, tests/bench for bench/), and a helper beside the tests that import it (tests/support
# when several folders do)
ROOT_FILES = ("conftest.py", "test_structure.py", "test_docs.py", "test_file_seconds.py", "test_leakcheck.py")


def strays_at_the_root(tests: Path) -> list[str]:
    """Python files at the root of the test tree that are not among its repository-wide ones."""
    return [f"tests/{p.name}: not a test of the repository as a whole; move it to the folder of the package it tests "
            "(a helper: beside the tests that import it, tests/support if several folders do)"
            for p in sorted(tests.glob("*.py")) if p.name not in ROOT_FILES]


def test_the_test_tree_mirrors_the_package():
    assert strays_at_the_root(TESTS) == []


def test_the_root_check_catches_a_stray_test_and_helper(tmp_path):
    for name in ("conftest.py", "test_docs.py", "test_render.py", "wbhelper.py", "notes.txt"):
        (tmp_path / name).write_text("")
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "test_export.py").write_text("")
    assert strays_at_the_root(tmp_path) == [
        "tests/test_render.py: not a test of the repository as a whole; move it to the folder of the package it tests "
        "(a helper: beside the tests that import it, tests/support if several folders do)",
        "tests/wbhelper.py: not a test of the repository as a whole; move it to the folder of the package it tests "
        "(a helper: beside the tests that import it, tests/support if several folders do)"]


def unknown_tier_files(tests: Path) -> list[str]:
    """The test files tests/conftest.py puts in a tier by path (its *_MODULES tuples) that do not exist: a moved file
    would silently leave its tier."""
    tree = ast.parse((tests / "conftest.py").read_text())
    return [f"tests/conftest.py:{node.lineno}: {target.id} names {value.value}, which is not a file under tests/"
            for node in tree.body if isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple)
            for target in node.targets if isinstance(target, ast.Name) and target.id.endswith("_MODULES")
            for value in node.value.elts
            if isinstance(value, ast.Constant) and not (tests / str(value.value)).is_file()]


def test_the_tiers_name_files_that_exist():
    assert unknown_tier_files(TESTS) == []


def test_the_tier_check_catches_a_moved_file(tmp_path):
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "test_cli.py").write_text("")
    (tmp_path / "conftest.py").write_text('SLOW_DIRS = ("hands",)\nSLOW_MODULES = ("cli/test_cli.py", "test_cli.py")\n')
    assert unknown_tier_files(tmp_path) == ["tests/conftest.py:2: SLOW_MODULES names test_cli.py, which is not a file under tests/"]


def test_the_isolation_pass_collects_every_file_of_the_isolation_tests_and_no_other(pytestconfig):
    """`-m isolation` skips the other files at collection (conftest.pytest_ignore_collect): a file it skipped that
    holds isolation tests would never run as the ordinary user, and nothing else would say so."""
    conftest = next(p for p in pytestconfig.pluginmanager.get_plugins()
                    if getattr(p, "__file__", None) == str(TESTS / "conftest.py"))

    class Isolation:
        def getoption(self, name: str, default: object = None) -> object:
            return "isolation" if name == "markexpr" else default

    def collected(path: Path) -> bool:
        ways = [p for p in path.parents if TESTS in p.parents] + [path]
        return not any(conftest.pytest_ignore_collect(p, Isolation()) for p in ways)

    files = sorted(TESTS.rglob("test_*.py"))
    marked = {f for f in files if conftest._isolation_path(f.relative_to(TESTS))}
    assert len(marked) >= 10 and {f for f in files if collected(f)} == marked
    assert all(collected(f) for f in TESTS.rglob("conftest.py") if f.parent in {m.parent for m in marked} | {TESTS})


# -- the brain's parts -------------------------------------------------------------------------------------------

BRAIN = "workbench.brain"
# The brain's floors, from the ground (docs/architecture.md): its parts import each other one way, so `Brain`
# is a facade over parts that never call back into it or into the parts above them.
BRAIN_FLOORS = (
    # the parts, each one idea, none knowing the loop: which turn runs where, the request as a fold of the events
    # and its cold read, tools, a new session's prefix, live output, the models
    ("workbench.brain.turns", "workbench.brain.request", "workbench.brain.coldread", "workbench.brain.tools",
     "workbench.brain.sessions", "workbench.brain.live", "workbench.brain.models"),
    ("workbench.brain.views",),  # what is kept of each session, and every write to its log
    ("workbench.brain.calls",),  # tool calls in the session's hands, recorded through the views
    ("workbench.brain.loop",),  # one turn: model calls, then the calls
    ("workbench.brain.brain", BRAIN),  # Brain, the facade the rest of the code holds; it starts turns
)


def test_the_brain_parts_depend_one_way():
    assert floor_problems(graph(), BRAIN, BRAIN_FLOORS, "BRAIN_FLOORS") == []


def test_the_floor_check_catches_a_brain_part_calling_back():
    g = {"workbench.brain.views": {"workbench.brain.loop", "workbench.brain.request"},
         "workbench.brain.calls": {"workbench.brain.views"},  # downward: fine
         "workbench.brain.models.anthropic": {"workbench.brain.brain"},
         "workbench.brain.scratch": set()}
    assert floor_problems(g, BRAIN, BRAIN_FLOORS, "BRAIN_FLOORS") == [
        "workbench.brain.models.anthropic (floor 0) imports workbench.brain.brain (floor 4): BRAIN_FLOORS depend downward",
        "workbench.brain.scratch is on no floor of BRAIN_FLOORS: put it on one",
        "workbench.brain.views (floor 1) imports workbench.brain.loop (floor 3): BRAIN_FLOORS depend downward",
    ]


# -- one owner per fact: "is this session running?" ---------------------------------------------------------------

RUNNING_OWNER = "workbench.brain.turns"  # Turns: the turn registry, and the plugins' `driving` hooks as its drivers
TURNS_MAKER = "workbench.brain.brain"  # the brain makes its one registry


def second_running_owners(mods: dict[str, tuple[Path, ast.Module]]) -> list[str]:
    """Where the core answers "is this session running?" itself instead of asking brain/turns.py: it calls a
    plugin's `driving` hook (the owner combines them with the turns), or makes a turn registry of its own. A plugin
    package answers its own hook from its own state."""
    problems = []
    for name, (_, tree) in sorted(mods.items()):
        if name == RUNNING_OWNER or _under(name, PLUGIN_PACKAGES):
            continue
        calls = sorted((n for n in ast.walk(tree) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset))
        for node in calls:
            f = node.func
            called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if called == "driving":
                problems.append(f"{name}:{node.lineno}: {ast.unparse(node)} asks a plugin whether a session runs: "
                                "ask brain.turns (at_work, driven)")
            elif called == "Turns" and name != TURNS_MAKER:
                problems.append(f"{name}:{node.lineno}: {ast.unparse(node)} is a second turn registry: ask brain.turns")
    return problems


def test_running_has_one_owner():
    """Listings, delete, a server's wake and a new turn's check all ask brain.turns (docs/architecture.md)."""
    assert second_running_owners(modules()) == []


def test_the_running_owner_check_catches_a_second_one():
    source = ("def running(self, sid):\n"
              "    return self.brain.running(sid) or any(p.driving(sid) for p in self.plugins)\n"
              "mine = Turns()\n"
              "hooks = [p.driving for p in plugins]\n")  # handing the hooks to the owner: not asking them
    mods = {"workbench.host": (PKG / "host.py", ast.parse(source)),
            "workbench.memory.plugin": (PKG / "memory" / "plugin.py", ast.parse(source))}  # a plugin's own: its
    assert second_running_owners(mods) == [
        "workbench.host:2: p.driving(sid) asks a plugin whether a session runs: ask brain.turns (at_work, driven)",
        "workbench.host:3: Turns() is a second turn registry: ask brain.turns",
    ]


# -- Inspect AI: an optional extra ---------------------------------------------------------------------------------

# inspect_ai is installed only with the `inspect` extra: the modules that use it are its own, and nothing else
# imports them (the sandbox environment is loaded by Inspect through its entry point; the exporter by the command)
INSPECT_MODULES = ("workbench.inspect_sandbox", "workbench.evals.inspect_log")


def inspect_imports(mods: dict[str, tuple[Path, ast.Module]]) -> list[str]:
    """Modules other than INSPECT_MODULES that import inspect_ai, or import one of them at their top level."""
    problems = []
    for name, (path, tree) in sorted(mods.items()):
        if name in INSPECT_MODULES:
            continue
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for mod, _, line in import_statements(name, path, ast.Module(body=[node], type_ignores=[])):
                if mod == "inspect_ai" or mod.startswith("inspect_ai."):
                    problems.append(f"{name}:{line}: imports {mod}: only {', '.join(INSPECT_MODULES)} may (an extra)")
                elif mod in INSPECT_MODULES and id(node) in top:
                    problems.append(f"{name}:{line}: imports {mod} at its top: import it where it is used (an extra)")
    return problems


def test_only_the_inspect_modules_import_inspect_ai_and_nothing_imports_them_eagerly():
    assert inspect_imports(modules()) == []


def test_the_inspect_import_check_catches_one():
    source = "import inspect_ai.log\nfrom .inspect_log import write_logs\ndef f():\n    from .inspect_log import eval_logs\n"
    mods = {"workbench.evals.cli": (PKG / "evals" / "cli.py", ast.parse(source))}
    assert inspect_imports(mods) == [
        "workbench.evals.cli:1: imports inspect_ai.log: only workbench.inspect_sandbox, workbench.evals.inspect_log may "
        "(an extra)",
        "workbench.evals.cli:2: imports workbench.evals.inspect_log at its top: import it where it is used (an extra)",
    ]
