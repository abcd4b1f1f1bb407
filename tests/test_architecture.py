"""The package's layering, checked from its source (docs/architecture.md, "Layers").

Every ``import`` / ``from ... import`` in ``expstore/`` is read with :mod:`ast`, wherever it
sits: at module level, inside a function (lazy imports), under ``if TYPE_CHECKING:``, in a
``try``. All of them count, for the layer rule and for circles alike: a lazy import is
still a dependency (it runs the first time the function does), and a typing-only import
says the module knows the other one's types, which is the direction the layers forbid; a
typing-only circle also turns into a real one as soon as someone drops the guard. The
failure messages say which kind each import is, to help whoever fixes it.
``importlib.import_module("expstore....")`` with a literal name counts as an import too.

Resolution: relative imports are resolved against the importing module's package;
``from pkg import name`` is an edge to the submodule ``pkg.name`` when that is a module,
else to ``pkg`` itself (its ``__init__``). ``import a.b.c`` is an edge to ``a.b.c`` only:
the implicit imports of the parent packages are not edges (otherwise every module would
"import" ``expstore/__init__.py``, the top of the stack). So a package ``__init__`` that
imports its submodules, one of which imports a sibling, forms no circle; two modules
importing each other do, and so does a submodule importing names from its own package's
``__init__`` while that ``__init__`` imports it.

Checks (each its own test, each able to fail: ``test_checker_*`` feed it fake packages):

(a) no module imports a module of a higher layer (``LAYERS``), nor a module ``APART``
    forbids it (``index`` and ``storage`` are siblings that never import each other;
    ``sampling`` plans from the index only);
(b) no import circles among expstore modules (strongly connected components of the import
    graph, each reported with its modules and the import lines of a shortest circle);
(c) every expstore module is placed in ``LAYERS`` (a new module fails until it is), and
    every entry of ``LAYERS`` / ``APART`` still names a module;
(d) every import of an ``expstore`` module names one that exists (a moved module leaves no
    stale import behind, lazy ones included), and so does every plug-in named by a string
    (``"expstore.x.y:Name"`` anywhere, e.g. the backends' ``known_backends``; a module path
    in a ``registry.py``, e.g. the dataset formats).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = "expstore"
SRC = Path(__file__).resolve().parent.parent / PACKAGE

#: Module-name prefix -> layer (bottom 0 .. top 7). A module gets the layer of its longest
#: matching prefix (a prefix matches itself and everything below it: ``expstore.storage``
#: covers ``expstore.storage.backends.s3``), except ``expstore`` itself, which matches only
#: the package face ``expstore/__init__.py``. A module imports only from its own layer or
#: lower ones, so the modules of one subpackage (one layer) may import each other.
LAYERS: dict[str, int] = {
    # 0: every exception class of the package
    "expstore.errors": 0,
    # 1: the model (row model, Field, spec, spaces <-> spec, input validation)
    "expstore.rows": 1,
    "expstore.field": 1,
    "expstore.spec": 1,
    "expstore.spaces": 1,
    "expstore.validate": 1,
    "expstore.step_check": 1,
    # 2: the in-RAM index and the bytes on storage (siblings, see APART)
    "expstore.index": 2,
    "expstore.storage": 2,
    # 3: samplers: a need -> plans (plain data), from the index only
    "expstore.sampling": 3,
    # 4: plans -> batches against a row source; DataLoader plumbing
    "expstore.loading": 4,
    # 5: the Store face and the offline tools on it
    "expstore.api": 5,
    "expstore.store": 5,
    "expstore.saved_priorities": 5,
    "expstore.appender": 5,
    "expstore.step_kernel_path": 5,
    "expstore.write_access": 5,
    "expstore.index_loader": 5,
    "expstore.verify": 5,
    "expstore.repair": 5,
    "expstore.upgrade": 5,
    "expstore.episode_view": 5,
    # 6: edges: dataset formats, framework integrations, test helpers
    "expstore.datasets": 6,
    "expstore.integrations": 6,
    "expstore.testing": 6,
    # 7: the command line and the package face
    "expstore.cli": 7,
    "expstore.cli_common": 7,
    "expstore.cli_store_commands": 7,
    "expstore.cli_dataset_commands": 7,
    "expstore": 7,
}

#: Importer prefix -> prefixes it must not import even where the layers would allow it.
APART: dict[str, tuple[str, ...]] = {
    "expstore.index": ("expstore.storage",),
    "expstore.storage": ("expstore.index",),
    "expstore.sampling": ("expstore.storage", "expstore.loading", "expstore.store"),
}

#: The rooms of ``expstore/storage/``, bottom first (docs/architecture.md, "Storage rooms"). A
#: room imports from its own room or a lower one; a module outside a room imports it only
#: through its face (the room's ``__init__``), never one of its modules.
STORAGE_ROOMS: tuple[str, ...] = (
    "expstore.storage.faults",  # crash points: a leaf every room may call
    "expstore.storage.native",  # C kernels and their loaders
    "expstore.storage.backends",  # where bytes live (and the shard cache in front)
    "expstore.storage.format",  # what the bytes mean
    "expstore.storage.ownership",  # who may write a lane: leases, fences
    "expstore.storage.write",  # the append path
    "expstore.storage.read",  # the read path
)

LAYER_NAMES = {0: "errors", 1: "model", 2: "index/storage", 3: "sampling", 4: "loading",
               5: "store", 6: "edges", 7: "face"}


# -- reading the source ----------------------------------------------------------------------
@dataclass(frozen=True)
class Import:
    """One import site: ``source`` (module) imports ``target`` (module) at ``path:line``."""

    source: str
    target: str
    path: str
    line: int
    text: str  # the statement as written
    kind: str  # "module level" | "in function f" | "under TYPE_CHECKING" | ...

    def where(self) -> str:
        return f"{self.path}:{self.line}"

    def describe(self) -> str:
        return f"{self.where()}: {self.source} imports {self.target} ({self.kind}): {self.text}"


@dataclass(frozen=True)
class Module:
    name: str
    path: str  # shown in messages (relative to the repository)
    source: str | None  # None: a compiled extension (no imports of its own)
    is_package: bool = False


def discover(root: Path = SRC, package: str = PACKAGE) -> dict[str, Module]:
    """Every module of the package on disk: ``*.py`` files, and C extensions (``*.c``
    sources built by setup.py, or built ``*.so`` files) as leaf modules."""
    base = root.parent
    mods: dict[str, Module] = {}
    for path in sorted(root.rglob("*")):
        if "__pycache__" in path.parts or not path.is_file():
            continue
        rel = path.relative_to(root)
        parts = [package, *rel.parent.parts]
        shown = path.relative_to(base).as_posix()
        if path.suffix == ".py":
            if path.stem == "__init__":
                mods[".".join(parts)] = Module(".".join(parts), shown, path.read_text(), True)
            else:
                name = ".".join([*parts, path.stem])
                mods[name] = Module(name, shown, path.read_text())
        elif path.suffix in (".c", ".so"):
            name = ".".join([*parts, path.name.split(".")[0]])
            mods.setdefault(name, Module(name, shown, None))
    return mods


def _package_of(mod: Module) -> str:
    return mod.name if mod.is_package else mod.name.rpartition(".")[0]


def _resolve_from(mod: Module, level: int, module: str | None) -> str:
    """The absolute module a ``from <dots><module> import ...`` names."""
    if level == 0:
        return module or ""
    parts = _package_of(mod).split(".")
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    return ".".join([*parts, module] if module else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class _Walker(ast.NodeVisitor):
    """Collects ``(target module name, node, kind)`` for every import in one module."""

    def __init__(self, mod: Module) -> None:
        self.mod = mod
        self.context: list[str] = []
        self.found: list[tuple[str, list[str] | None, ast.AST, str]] = []

    def kind(self) -> str:
        return ", ".join(self.context) if self.context else "module level"

    def _scoped(self, label: str, node: ast.AST) -> None:
        self.context.append(label)
        self.generic_visit(node)
        self.context.pop()

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._scoped(f"in class {node.name}", node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._scoped(f"in function {node.name}", node)

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            self.context.append("under TYPE_CHECKING")
            for child in node.body:
                self.visit(child)
            self.context.pop()
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.found.append((alias.name, None, node, self.kind()))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = _resolve_from(self.mod, node.level, node.module)
        self.found.append((base, [a.name for a in node.names], node, self.kind()))

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
        if name in ("import_module", "__import__") and node.args and \
                isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            self.found.append((node.args[0].value, None, node, self.kind() + ", by name"))
        self.generic_visit(node)


def _in_package(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def scan(mods: Mapping[str, Module], package: str = PACKAGE
         ) -> tuple[list[Import], list[Import]]:
    """All imports between the package's modules, and imports naming package modules that
    do not exist (``unresolved``, target = the name as written)."""
    edges: list[Import] = []
    unresolved: list[Import] = []
    for mod in mods.values():
        if mod.source is None:
            continue
        tree = ast.parse(mod.source, filename=mod.path)
        lines = mod.source.splitlines()
        walker = _Walker(mod)
        walker.visit(tree)
        for base, names, node, kind in walker.found:
            if not _in_package(base, package):
                continue
            first = node.lineno
            last = getattr(node, "end_lineno", None) or first
            text = " ".join(s.strip() for s in lines[first - 1 : last])

            if names is None:  # import a.b.c / import_module("a.b.c")
                targets = [base]
            else:  # from pkg import submodule / from module import name
                targets = [f"{base}.{n}" if n != "*" and f"{base}.{n}" in mods else base
                           for n in names]
            for target in dict.fromkeys(targets):  # one site per module a statement names
                site = Import(mod.name, target, mod.path, first, text, kind)
                if target not in mods:
                    unresolved.append(site)
                elif target != mod.name:  # a module naming itself is no dependency
                    edges.append(site)
    return edges, unresolved


# -- the checks --------------------------------------------------------------------------------
def _matches(name: str, prefix: str, package: str = PACKAGE) -> bool:
    if prefix == package:  # the package face only, not everything below it
        return name == package
    return _in_package(name, prefix)


def _longest(name: str, prefixes: Iterable[str], package: str = PACKAGE) -> str | None:
    hits = [p for p in prefixes if _matches(name, p, package)]
    return max(hits, key=len) if hits else None


def layer_of(name: str, layers: Mapping[str, int], package: str = PACKAGE) -> int | None:
    p = _longest(name, layers, package)
    return None if p is None else layers[p]


def _label(name: str, layers: Mapping[str, int], package: str) -> str:
    layer = layer_of(name, layers, package)
    return f"{name} (layer {layer} {LAYER_NAMES.get(layer, '')}".rstrip() + ")"


def layer_violations(edges: Iterable[Import], layers: Mapping[str, int],
                     apart: Mapping[str, tuple[str, ...]], package: str = PACKAGE) -> list[str]:
    """(a): imports of a higher layer, and imports ``apart`` forbids."""
    out = []
    for e in edges:
        src, dst = layer_of(e.source, layers, package), layer_of(e.target, layers, package)
        if src is None or dst is None:
            continue  # unplaced modules are reported by coverage()
        why = None
        if dst > src:
            why = "imports a higher layer"
        else:
            rule = _longest(e.source, apart, package)
            banned = [p for p in apart.get(rule, ()) if _matches(e.target, p, package)] \
                if rule else []
            if banned:
                why = f"{rule} must not import {banned[0]}"
        if why:
            out.append(f"{e.where()}: {_label(e.source, layers, package)} imports "
                       f"{_label(e.target, layers, package)}: {why} ({e.kind}): {e.text}")
    return out


def _room(name: str, rooms: Sequence[str]) -> int | None:
    hits = [i for i, r in enumerate(rooms) if _in_package(name, r)]
    return hits[0] if hits else None


def room_violations(edges: Iterable[Import], rooms: Sequence[str]) -> list[str]:
    """(e): an import of a higher room, or of a room's module other than its face from
    outside that room (``rooms``: packages or modules, bottom first)."""
    out = []
    for e in edges:
        src, dst = _room(e.source, rooms), _room(e.target, rooms)
        if dst is None or src == dst:
            continue
        face = rooms[dst]
        if src is not None and src < dst:
            out.append(f"{e.where()}: {e.source} (room {rooms[src]}) imports {e.target} "
                       f"(room {face}): imports a higher room ({e.kind}): {e.text}")
        elif e.target != face:
            out.append(f"{e.where()}: {e.source} imports {e.target}, inside {face}: import "
                       f"it through the face ``{face}`` ({e.kind}): {e.text}")
    return out


def _sccs(nodes: Iterable[str], succ: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Strongly connected components (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(succ.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(succ.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    out.append(sorted(comp))
    return out


def _shortest_cycle(start: str, members: set[str], succ: Mapping[str, set[str]]) -> list[str]:
    """Shortest path start -> ... -> start inside one component (breadth first)."""
    prev: dict[str, str] = {}
    frontier = [start]
    seen = {start}
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(succ.get(v, ())):
                if w not in members:
                    continue
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [*reversed(path), start]
                if w not in seen:
                    seen.add(w)
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return [start]


def cycles(edges: Iterable[Import]) -> list[str]:
    """(b): one message per import circle (component of more than one module)."""
    sites: dict[tuple[str, str], list[Import]] = defaultdict(list)
    succ: dict[str, set[str]] = defaultdict(set)
    for e in edges:
        sites[(e.source, e.target)].append(e)
        succ[e.source].add(e.target)
    nodes = set(succ) | {t for ts in succ.values() for t in ts}
    out = []
    for comp in _sccs(nodes, succ):
        if len(comp) < 2:
            continue
        members = set(comp)
        loop = _shortest_cycle(comp[0], members, succ)
        lines = [f"import circle among {len(comp)} modules: {', '.join(comp)}",
                 "  a shortest circle: " + " -> ".join(loop)]
        on_loop = set(zip(loop, loop[1:]))
        for a, b in zip(loop, loop[1:]):
            lines += [f"    {s.describe()}" for s in sites[(a, b)]]
        rest = sorted(k for k in sites if k[0] in members and k[1] in members
                       and k not in on_loop)
        if rest:
            lines.append("  other imports inside the circle:")
            lines += [f"    {s.describe()}" for k in rest for s in sites[k]]
        out.append("\n".join(lines))
    return out


def coverage(mods: Iterable[str], layers: Mapping[str, int],
             apart: Mapping[str, tuple[str, ...]], package: str = PACKAGE) -> list[str]:
    """(c): modules no layer entry places, and entries that name no module (stale)."""
    mods = sorted(mods)
    out = [f"{m}: not in the layer table (tests/test_architecture.py LAYERS): give it a "
           "layer" for m in mods if layer_of(m, layers, package) is None]
    named = set(layers) | set(apart) | {p for ps in apart.values() for p in ps}
    out += [f"{p}: layer table entry names no module (moved or removed?)"
            for p in sorted(named) if not any(_matches(m, p, package) for m in mods)]
    return out


def _top_level_names(source: str) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def registry_names(mods: Mapping[str, Module], package: str = PACKAGE) -> list[str]:
    """(d), plug-ins loaded by name: ``"pkg.mod:attr"`` strings anywhere in the package
    must name an existing module defining ``attr``; ``"pkg.mod"`` strings in
    ``registry.py`` files an existing module."""
    out = []
    for mod in mods.values():
        if mod.source is None:
            continue
        registry = mod.path.endswith("registry.py")
        for node in ast.walk(ast.parse(mod.source, filename=mod.path)):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            name, colon, attr = node.value.partition(":")
            if not _in_package(name, package) or " " in node.value or \
                    not (colon or registry):
                continue
            where = f"{mod.path}:{node.lineno}: names {node.value!r}"
            target = mods.get(name)
            if target is None:
                out.append(f"{where}: module {name} does not exist")
            elif attr and target.source is not None and \
                    attr not in _top_level_names(target.source):
                out.append(f"{where}: module {name} defines no {attr}")
    return out


# -- the package as it is ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tree():
    mods = discover()
    edges, unresolved = scan(mods)
    return mods, edges, unresolved


def _fail(what: str, problems: list[str]) -> None:
    if problems:
        pytest.fail(f"{len(problems)} {what} (docs/architecture.md, 'Layers'):\n"
                    + "\n".join(problems), pytrace=False)


def test_no_import_of_a_higher_layer(tree):
    _, edges, _ = tree
    _fail("imports against the layers", layer_violations(edges, LAYERS, APART))


def test_storage_rooms_in_order_and_entered_through_faces(tree):
    mods, edges, _ = tree
    assert all(r in mods for r in STORAGE_ROOMS), "a storage room was moved: update STORAGE_ROOMS"
    rooms = [r for r in mods if r.startswith("expstore.storage.")
             and r.count(".") == 2 and _room(r, STORAGE_ROOMS) is None]
    assert not rooms, f"{rooms}: not in STORAGE_ROOMS (tests/test_architecture.py): place it"
    _fail("imports between storage rooms", room_violations(edges, STORAGE_ROOMS))


def test_no_import_circles(tree):
    _, edges, _ = tree
    _fail("import circles", cycles(edges))


def test_every_module_has_a_layer(tree):
    mods, _, _ = tree
    assert f"{PACKAGE}.store" in mods and PACKAGE in mods  # the walk found the package
    _fail("layer table problems", coverage(mods, LAYERS, APART))


def test_every_import_names_an_existing_module(tree):
    mods, _, unresolved = tree
    _fail("imports of missing modules",
          [f"{u.where()}: {u.source} imports {u.target}, which does not exist ({u.kind}): "
           f"{u.text}" for u in unresolved] + registry_names(mods))


# -- the checker can fail: a fake package with every kind of mistake ------------------------------
FAKE_LAYERS = {"fake.errors": 0, "fake.index": 2, "fake.storage": 2, "fake.sampling": 3,
               "fake.store": 5, "fake.cli": 7, "fake": 7}
FAKE_APART = {"fake.index": ("fake.storage",), "fake.storage": ("fake.index",),
              "fake.sampling": ("fake.storage",)}


def _fake(files: dict[str, str]) -> dict[str, Module]:
    mods = {}
    for name, src in files.items():
        is_pkg = name.endswith(".__init__")
        name = name.removesuffix(".__init__")
        path = name.replace(".", "/") + ("/__init__.py" if is_pkg else ".py")
        mods[name] = Module(name, path, src, is_pkg)
    return mods


FAKE = _fake({
    "fake.__init__": "from .store import Store\nfrom . import sampling\n",
    "fake.errors": "import os\nfrom .cli import main  # upward\n",
    "fake.cli": "import sys\n",
    "fake.index.__init__": "from .tree import Tree\n",
    "fake.index.tree": "from ..errors import E\nfrom . import rows\n",
    "fake.index.rows": "import numpy as np\n",
    "fake.storage.__init__": "",
    "fake.storage.shard": (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from fake.index.rows import RowIndex  # sibling, typing only\n"),
    "fake.sampling.__init__": "from .a import A\nfrom .b import B\n",
    "fake.sampling.a": "from .b import helper\nfrom ..index import Tree\n",
    "fake.sampling.b": (
        "import fake.index.rows\n"
        "def helper():\n"
        "    from .a import A  # lazy: still a circle\n"
        "    from ..storage import shard  # sampling reads no storage\n"
        "    from .gone import x  # moved away\n"),
    "fake.store": "import importlib\nfrom .sampling import A\n"
                  "importlib.import_module('fake.sampling.b')\n",
    "fake.newmod": "from . import errors\n",
})


def test_checker_resolves_imports():
    edges, unresolved = scan(FAKE, "fake")
    got = {(e.source, e.target, e.line) for e in edges}
    assert ("fake", "fake.store", 1) in got  # from .store import Store (__init__)
    assert ("fake", "fake.sampling", 2) in got  # from . import sampling: the subpackage
    assert ("fake.index.tree", "fake.index.rows", 2) in got  # from . import submodule
    assert ("fake.index.tree", "fake.errors", 1) in got  # two dots
    assert ("fake.sampling.a", "fake.index", 2) in got  # a name from a package __init__
    assert ("fake.storage.shard", "fake.index.rows", 3) in got  # absolute, TYPE_CHECKING
    assert ("fake.sampling.b", "fake.index.rows", 1) in got  # import a.b.c: a.b.c only
    assert ("fake.store", "fake.sampling.b", 3) in got  # import_module("...")
    # the parent packages an import runs first are not edges
    assert not any(e.target == "fake" for e in edges)
    assert ("fake.sampling.b", "fake.index") not in {(e.source, e.target) for e in edges}
    kinds = {(e.source, e.target): e.kind for e in edges}
    assert kinds[("fake.storage.shard", "fake.index.rows")] == "under TYPE_CHECKING"
    assert kinds[("fake.sampling.b", "fake.sampling.a")] == "in function helper"
    assert [(u.source, u.target, u.line) for u in unresolved] == [
        ("fake.sampling.b", "fake.sampling.gone", 5)]


def test_checker_reports_upward_and_forbidden_imports():
    edges, _ = scan(FAKE, "fake")
    found = layer_violations(edges, FAKE_LAYERS, FAKE_APART, "fake")
    assert len(found) == 3, found
    up, sibling, apart = sorted(found)
    assert up == ("fake/errors.py:2: fake.errors (layer 0 errors) imports fake.cli (layer 7 "
                  "face): imports a higher layer (module level): from .cli import main  # upward")
    assert sibling.startswith("fake/sampling/b.py:4: fake.sampling.b") and \
        "fake.sampling must not import fake.storage (in function helper)" in sibling
    assert apart.startswith("fake/storage/shard.py:3: fake.storage.shard") and \
        "fake.storage must not import fake.index (under TYPE_CHECKING)" in apart
    # the package face may import anything below it; siblings in a subpackage may too
    assert not any(v.startswith(("fake/__init__.py", "fake/index/tree.py")) for v in found)


def test_checker_reports_circles_with_their_import_lines():
    edges, _ = scan(FAKE, "fake")
    found = cycles(edges)
    assert len(found) == 1, found
    msg = found[0]
    assert msg.startswith("import circle among 2 modules: fake.sampling.a, fake.sampling.b")
    assert "fake.sampling.a -> fake.sampling.b -> fake.sampling.a" in msg
    assert "fake/sampling/a.py:1: fake.sampling.a imports fake.sampling.b (module level): " \
           "from .b import helper" in msg
    assert "fake/sampling/b.py:3: fake.sampling.b imports fake.sampling.a (in function " \
           "helper): from .a import A  # lazy: still a circle" in msg
    # fake -> fake.store -> fake.sampling -> fake.sampling.a -> fake.index: a chain, no circle
    assert "fake.store" not in msg and "fake.index" not in msg


def test_checker_finds_a_circle_through_a_package_init():
    mods = _fake({"p.__init__": "from .a import f\n", "p.a": "from . import b\n",
                  "p.b": "from p import f  # the package face, which imports a\n"})
    found = cycles(scan(mods, "p")[0])
    assert len(found) == 1 and "p -> p.a -> p.b -> p" in found[0], found
    # without b's import of the face: __init__ -> a -> b is a chain
    mods["p.b"] = Module("p.b", "p/b.py", "import os\n")
    assert cycles(scan(mods, "p")[0]) == []


def test_checker_reports_unplaced_modules_and_stale_entries():
    found = coverage(FAKE, {**FAKE_LAYERS, "fake.memory": 6}, FAKE_APART, "fake")
    assert found == [
        "fake.newmod: not in the layer table (tests/test_architecture.py LAYERS): give it a "
        "layer",
        "fake.memory: layer table entry names no module (moved or removed?)"]
    # the root entry places the package face only, not every module under it
    assert layer_of("fake.newmod", FAKE_LAYERS, "fake") is None
    assert layer_of("fake", FAKE_LAYERS, "fake") == 7
    assert layer_of("fake.index.rows", FAKE_LAYERS, "fake") == 2


def test_checker_reports_registry_names_of_missing_modules():
    mods = _fake({"p.__init__": "KNOWN = {'x': 'p.mod:Thing', 'y': 'p.mod:Gone'}\n",
                  "p.mod": "class Thing:\n    pass\n",
                  "p.registry": "register('a', 'p.mod')\nregister('b', 'p.gone:Thing')\n"
                                "register('c', 'p.old')\nHELP = 'p.gone is only prose'\n",
                  "p.other": "NAME = 'p.old'  # outside a registry: just a string\n"})
    assert sorted(registry_names(mods, "p")) == [
        "p/__init__.py:1: names 'p.mod:Gone': module p.mod defines no Gone",
        "p/registry.py:2: names 'p.gone:Thing': module p.gone does not exist",
        "p/registry.py:3: names 'p.old': module p.old does not exist"]


def test_checker_reports_higher_rooms_and_imports_past_a_face():
    mods = _fake({
        "fake.__init__": "",
        "fake.store": "from .storage.low import thing\nfrom .storage.high.mod import x\n",
        "fake.storage.__init__": "",
        "fake.storage.low.__init__": "from .a import thing\n",
        "fake.storage.low.a": "from ..high import y  # upward\nthing = 1\n",
        "fake.storage.high.__init__": "from .mod import x, y\n",
        "fake.storage.high.mod": "from ..low import thing\nfrom ..low.a import thing as t\n",
    })
    edges, _ = scan(mods, "fake")
    got = room_violations(edges, ("fake.storage.low", "fake.storage.high"))
    assert len(got) == 3, got
    assert any("fake.storage.low.a (room fake.storage.low) imports fake.storage.high" in g
               and "higher room" in g for g in got)
    assert any(g.startswith("fake/store.py:2: fake.store imports fake.storage.high.mod")
               and "through the face" in g for g in got)
    assert any("fake.storage.high.mod imports fake.storage.low.a" in g for g in got)


def test_every_module_imports():
    """Every module of the package imports: a name moved to another face leaves no import
    of it behind (the checks above see modules, not the names imported from them)."""
    import importlib

    failed = []
    for name, mod in sorted(discover().items()):
        if mod.source is None:
            continue  # compiled extensions: optional, tested where they are built
        try:
            importlib.import_module(name)
        except ImportError as e:
            failed.append(f"{mod.path}: {e}")
    _fail("modules that do not import", failed)
