"""The project's layout rules, checked on the source, not by importing it.

A small AST scanner reads every Python file of the project's packages
(``swemu``, ``hostlib``, ``cli``, ``bench``, ``p4``) and lists each import
that lands in the project: the importing module, the module imported (relative
imports resolved; ``from pkg import mod`` counted as an import of ``pkg.mod``),
the names taken from it, the line, and whether the import runs at import time,
inside a function (a lazy import is still a dependency) or only for the type
checker (``if TYPE_CHECKING:``). Nothing is imported, so the check costs a
parse of ~100 files and no Numba compile.

The rules are the layout of docs/design.md ("Layout"):

* layers, each importing only those below it::

      swemu.protocol   the shared base: codec, gRPC stubs, compiled UDP I/O,
                       raw memory views, socket helpers
      swemu.core       the switch, sans-IO: engine, kernels, reference, control
                       model, fault model
      swemu.observe    snapshots and captures: stats service and client, metrics,
                       TUI, pcap, decoder, scapy layer (they read plain dicts and
                       files; the server plugs them in, so they sit below it)
      swemu.serving    the switch on sockets and gRPC: data plane, server, shards,
                       control services
      cli              argument parsing and terminal output

  ``swemu.launch`` (starting processes) and ``swemu.options`` (sizes, optional
  extras) import nothing of the project; ``hostlib`` stands on ``swemu.protocol``
  alone; ``swemu.model`` (the scale model) and ``swemu.rack`` (the emulated rack)
  stand on the base and the launcher (the worker's sans-IO protocol is part of
  the base, ``swemu.protocol.worker``; hostlib programs are started by their
  command lines); nothing in ``swemu`` imports hostlib; ``p4`` (the Tofino target of the
  control model, which can also serve it) on ``swemu.protocol``, ``swemu.core``
  and ``swemu.serving``; ``cli`` and ``bench`` are the tops: nothing imports
  either, and bench never imports cli;
* no cycle between modules, whatever kind of import closes it;
* no private name (``_x``, or a module ``_x``) imported across packages;
* every package's docstring says what it may import, naming what ALLOWED gives it;
* no constant of the wire format defined outside ``swemu.protocol.wire``;
* compiled functions take records, at most MAX_KERNEL_PARAMETERS parameters,
  and each record (a NamedTuple) is declared once.

A new import that breaks a rule fails here with the import and its line;
``python -c "import sys; sys.path.insert(0, 'tests'); import test_layout as T;
[print(e) for e in T.scan()]"`` dumps the whole picture.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("swemu", "hostlib", "cli", "bench", "p4")

#: the layers of the target layout, bottom first: a module of a layer may import
#: its own layer and those listed for it (prefix match on dotted module names)
ALLOWED: dict[str, tuple[str, ...]] = {
    "swemu.launch": (),
    "swemu.options": (),
    "swemu.protocol": (),
    "swemu.core": ("swemu.protocol",),
    "swemu.observe": ("swemu.protocol", "swemu.core"),
    "swemu.serving": ("swemu.protocol", "swemu.core", "swemu.observe"),
    "hostlib": ("swemu.protocol",),
    "p4": ("swemu.protocol", "swemu.core", "swemu.serving"),
    "swemu.model": ("swemu.protocol", "swemu.core", "swemu.launch"),
    "swemu.rack": ("swemu.protocol", "swemu.launch"),
    "cli": ("swemu", "hostlib", "cli"),
    "bench": ("swemu", "hostlib", "p4", "bench"),
}

#: imports that cross a layer on purpose, each with its reason. (The package
#: facade ``swemu/__init__.py`` stands outside the layers: its imports are not
#: checked against them.)
EXCEPTIONS: dict[tuple[str, str], str] = {
    # the pytest11 entry point users load: it launches an emulator for their
    # tests, lazily, inside its fixtures; nothing in hostlib imports it
    ("hostlib.pytest_plugin", "swemu.launch"): "launches the emulator for user tests",
}


MODULE, LAZY, TYPING = "module", "lazy", "typing"


@dataclass(frozen=True)
class Edge:
    """One import of a project module by a project module."""

    source: str  # the importing module, dotted (a package is its __init__)
    target: str  # the module imported
    names: tuple[str, ...]  # names taken from target by ``from target import ...``
    line: int
    kind: str  # MODULE (at import time), LAZY (inside a function), TYPING

    def __str__(self) -> str:
        names = f" ({', '.join(self.names)})" if self.names else ""
        return f"{self.source}:{self.line} -> {self.target}{names} [{self.kind}]"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def project_files() -> dict[str, Path]:
    """Module name -> file, for every Python file of the project's packages."""
    files = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "__pycache__" not in path.parts:
                files[module_name(path)] = path
    return files


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement with its kind, however deeply nested."""

    def walk(node: ast.AST, kind: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child, kind
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                yield from walk(child, LAZY if kind == MODULE else kind)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), TYPING)
                for stmt in child.orelse:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), kind)
            else:
                yield from walk(child, kind)

    yield from walk(tree, MODULE)


def _resolve(source: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = source.split(".") if is_package else source.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _owner(name: str, modules: Iterable[str]) -> str | None:
    """The project module an imported dotted name lives in (longest prefix)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in modules:
            return candidate
    return None


@cache
def scan() -> tuple[Edge, ...]:
    """Every import of a project module by a project module."""
    files = project_files()
    edges = []
    for source, path in files.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        for node, kind in _imports(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = _owner(alias.name, files)
                    if target is not None:
                        edges.append(Edge(source, target, (), node.lineno, kind))
                continue
            base = _resolve(source, is_package, node)
            if _owner(base, files) is None:
                continue
            names = []
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in files:
                    edges.append(Edge(source, submodule, (), node.lineno, kind))
                else:
                    names.append(alias.name)
            if names:
                edges.append(Edge(source, _owner(base, files), tuple(names), node.lineno, kind))
    return tuple(edges)


def graph(kinds: Iterable[str] = (MODULE, LAZY, TYPING)) -> dict[str, set[str]]:
    """Module -> the project modules it imports (self-imports left out)."""
    kinds = set(kinds)
    out: dict[str, set[str]] = {m: set() for m in project_files()}
    for e in scan():
        if e.kind in kinds and e.source != e.target:
            out[e.source].add(e.target)
    return out


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def package_of(module: str) -> str:
    """The package a module belongs to: itself for a package, else its parent."""
    path = project_files()[module]
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def layer_of(module: str) -> str | None:
    matches = [layer for layer in ALLOWED if module == layer or module.startswith(layer + ".")]
    return max(matches, key=len) if matches else None


def _within(module: str, prefixes: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


# -- the scanner itself: known facts of the code ------------------------------------


def test_scanner_sees_the_projects_imports():
    edges = scan()
    assert len(edges) > 200, "the scanner found too few imports to be reading the code"
    found = {(e.source, e.target, e.names, e.kind) for e in edges}
    # an absolute import at module level, by name, across packages (hostlib -> swemu)
    assert any(
        s == "swemu.protocol.worker.kernels"
        and t.endswith("rawmem")
        and "bswap32" in n
        and k == MODULE
        for s, t, n, k in found
    )
    # ``from swemu import fastio``: an import of the module swemu.fastio (or its new home)
    assert any(s == "hostlib.fastpath" and t.endswith(".fastio") and not n for s, t, n, _ in found)
    # an import inside a function body is lazy and resolved to its module
    assert (
        "hostlib.fastpath",
        "swemu.protocol.worker.protocol",
        ("warmup_call",),
        LAZY,
    ) in found
    # ``if TYPE_CHECKING:`` imports are told apart
    assert any(e.source.startswith("swemu") and e.kind == TYPING for e in edges)
    # hostlib imports swemu today, by many names
    hostlib_to_swemu = [
        e for e in edges if e.source.startswith("hostlib.") and e.target[:6] == "swemu."
    ]
    assert len(hostlib_to_swemu) >= 10
    # a package __init__ resolves ``from . import x`` inside itself
    assert ("hostlib", "hostlib.client", ("AsyncContext", "Options"), MODULE) in found


def test_cycle_finder():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


# -- the rules ----------------------------------------------------------------------


def test_every_module_has_a_layer():
    """Every module of swemu sits in one of the layer packages (the package
    facade ``swemu/__init__.py`` aside)."""
    loose = [
        m
        for m in project_files()
        if m.split(".")[0] == "swemu" and m != "swemu" and not layer_of(m)
    ]
    assert not loose, f"modules outside the layers: {loose}"


def test_imports_point_down_the_layers():
    wrong = []
    for e in scan():
        src, dst = layer_of(e.source), layer_of(e.target)
        if src is None or src == dst or (e.source, e.target) in EXCEPTIONS:
            continue  # the swemu facade stands outside the layers
        if dst == "bench":
            continue  # test_nothing_imports_bench
        if dst is None or not _within(e.target, ALLOWED[src]):
            wrong.append(str(e))
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_hostlib_stands_on_the_protocol_base_alone():
    wrong = [
        str(e)
        for e in scan()
        if e.source.split(".")[0] == "hostlib"
        and e.target.split(".")[0] != "hostlib"
        and not _within(e.target, ("swemu.protocol",))
        and (e.source, e.target) not in EXCEPTIONS
    ]
    assert not wrong, "hostlib importing past the base:\n" + "\n".join(wrong)


def test_hostlib_uses_the_bases_public_names():
    """hostlib imports names the base package exports, never its modules' insides."""
    wrong = [
        str(e)
        for e in scan()
        if e.source.split(".")[0] == "hostlib"
        and e.target.split(".")[0] == "swemu"
        and any(_private(n) for n in (*e.names, *e.target.split(".")))
    ]
    assert not wrong, "\n".join(wrong)


def test_nothing_imports_bench():
    """bench is the top: the products it measures (``switchml simulate``,
    ``switchml cluster``) live in swemu.model and swemu.rack."""
    wrong = [
        str(e)
        for e in scan()
        if e.target.split(".")[0] == "bench" and e.source.split(".")[0] != "bench"
    ]
    assert not wrong, "imports of bench:\n" + "\n".join(wrong)


def test_nothing_below_cli_imports_cli():
    """cli is argument parsing and terminal output over the library: no package
    imports it (bench included: a command is run by its command line, e.g.
    ``python -m cli.worker``, never imported)."""
    wrong = [
        str(e)
        for e in scan()
        if e.target.split(".")[0] == "cli" and e.source.split(".")[0] != "cli"
    ]
    assert not wrong, "imports of cli from below it:\n" + "\n".join(wrong)


def test_bench_imports_nothing_of_cli():
    wrong = [str(e) for e in scan() if e.source.split(".")[0] == "bench" and e.target[:4] == "cli"]
    assert not wrong, "bench importing cli:\n" + "\n".join(wrong)


def test_no_import_cycles():
    """No cycle between modules, counting every kind of import: a lazy or
    type-only import that closes a loop still ties the two modules together."""
    found = cycles(graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_private_names_across_packages():
    wrong = []
    for e in scan():
        if package_of(e.source) == package_of(e.target):
            continue
        private = [n for n in e.names if _private(n)]
        if any(_private(part) for part in e.target.split(".")):
            private.append(e.target)
        if private:
            wrong.append(f"{e} private: {', '.join(private)}")
    assert not wrong, "private names across packages:\n" + "\n".join(wrong)


def test_each_package_says_what_it_may_import():
    """Each package's docstring names what it may import ("May import: ...")."""
    silent = []
    for module, path in project_files().items():
        if path.name != "__init__.py" or module.startswith("p4"):
            continue
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if "may import" not in doc.lower():
            silent.append(module)
    assert not silent, f"packages whose docstring does not say what they may import: {silent}"


def _module_constants(tree: ast.Module) -> Iterator[tuple[str, int]]:
    """Upper-case names bound at module level by assignment: ``(name, line)``."""
    for node in tree.body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        for t in targets:
            if isinstance(t, ast.Name) and t.id.isupper():
                yield t.id, node.lineno


def test_no_constant_of_the_wire_format_is_defined_twice():
    """The wire format's constants (``HEADER_LEN``, ``EXP_NONE``, ``SLOT_MASK``, …)
    are defined once, in ``swemu.protocol.wire``: any other module imports them.
    A copy (``HEADER_LEN = 10`` in a kernel module) drifts when the format does."""
    files = project_files()
    wire_tree = ast.parse(files["swemu.protocol.wire"].read_text())
    wire_names = {name for name, _ in _module_constants(wire_tree)}
    assert {"HEADER_LEN", "EXP_NONE", "EXP_TSI_BASE", "SLOT_MASK", "MSG_TYPE"} <= wire_names
    copies = [
        f"{module}:{line}: {name} (defined in swemu.protocol.wire)"
        for module, path in sorted(files.items())
        if module != "swemu.protocol.wire"
        for name, line in _module_constants(ast.parse(path.read_text()))
        if name in wire_names
    ]
    assert not copies, "\n".join(copies)


def _may_import_line(module: str) -> str:
    doc = ast.get_docstring(ast.parse(project_files()[module].read_text())) or ""
    line = doc[doc.lower().index("may import") :] if "may import" in doc.lower() else ""
    return " ".join(line.split())


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_each_layers_docstring_names_what_it_may_import(layer):
    """A layer package's "May import:" line names every layer ALLOWED gives it
    (or says "nothing of the project"), so the docstring and this file agree."""
    line = _may_import_line(layer)
    assert line, f"{layer}: no 'May import:' line"
    allowed = [a for a in ALLOWED[layer] if a != layer]
    if not allowed:
        assert "nothing of the project" in line, f"{layer}: {line!r}"
    missing = [a for a in allowed if not re.search(rf"\b{re.escape(a)}\b", line)]
    assert not missing, f"{layer}'s docstring does not name {missing}: {line!r}"


#: the most parameters a compiled function takes: its state comes in records
#: (docs/design.md, "The kernels' state"), not in long positional lists
MAX_KERNEL_PARAMETERS = 10


def _is_kernel(fn: ast.FunctionDef) -> bool:
    """Decorated with the project's ``kernel`` (``@kernel`` or ``@kernel(...)``)."""
    for d in fn.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if isinstance(target, ast.Name) and target.id == "kernel":
            return True
        if isinstance(target, ast.Attribute) and target.attr == "kernel":
            return True
    return False


def test_compiled_functions_take_records_not_long_argument_lists():
    """No compiled function takes more than MAX_KERNEL_PARAMETERS parameters:
    a loop's state is a record declared once (a NamedTuple), so a signature
    names its parts instead of listing dozens of arrays in an order that every
    caller repeats."""
    long = []
    for module, path in sorted(project_files().items()):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and _is_kernel(node):
                a = node.args
                n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)
                if n > MAX_KERNEL_PARAMETERS:
                    long.append(f"{module}.{node.name}: {n} parameters")
    assert not long, "\n".join(long)


def test_each_record_is_declared_once():
    """A NamedTuple record (``SwitchState``, ``WorkerState``, ``Rows``, ...) is
    declared in one module; the others import it."""
    where: dict[str, list[str]] = {}
    for module, path in sorted(project_files().items()):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and any(
                (isinstance(b, ast.Name) and b.id == "NamedTuple")
                or (isinstance(b, ast.Attribute) and b.attr == "NamedTuple")
                for b in node.bases
            ):
                where.setdefault(node.name, []).append(module)
    assert {"SwitchState", "Packets", "WorkerState", "Rows", "Sends", "BatchIO"} <= set(where)
    twice = {name: mods for name, mods in where.items() if len(mods) > 1}
    assert not twice, twice
