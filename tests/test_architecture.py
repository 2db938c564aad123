"""The package's shape (issue 13, "Done when"), checked on its source, not by convention.

1. No import cycle among ``sharding_store`` modules, counting imports inside functions,
   and the layer order of the module map (PLAN.md / README) holds: a lower layer never
   imports a higher one. The graph is built from every module's AST at module granularity:
   relative imports resolved, ``from . import x`` is an import of module ``x`` when ``x``
   is a module (else of the package), ``importlib.import_module`` with a constant or
   ``f"{__name__}.{name}"`` argument counts (the latter as importing every submodule of
   that package), and the package ``__init__``'s lazy re-exports (``_EXPORTS``, served by
   its ``__getattr__``) count as imports of their target modules.
   Imports under ``if TYPE_CHECKING:`` never run, so they do not count for cycles; they
   still count for the layer order (naming a higher layer's type is depending on it).
2. Nothing outside ``sharding_store/stores/`` and ``sharding_store/testing.py`` tests a
   concrete store class (``isinstance``/``issubclass``/``type(x) is``) or touches a store's
   private attributes (``_path``, ``_fs``, ``fs``, ``is_local``, ``call_s3``, ``root`` or any
   ``_private`` attribute of an ``inner``): capabilities are methods of the store interface.
3. No environment-variable hook in the package: ``os.environ``/``getenv`` only where the
   allow-list below says why; no ``SHARDING_STORE_TEST_*`` name anywhere in it.
4. ``counting`` is not in the package namespace; ``sharding_store.testing.CountingInner`` is.
5. One module (``codec/_native.py``) owns every ctypes binding and takes every raw address of an
   array (``.ctypes.data``, ``__array_interface__``): other modules pass arrays to its
   functions (issue 23).
6. No public function takes more than 8 parameters and no function (nested ones included)
   is longer than 80 lines (issue 23), counted as the issue counts: every parameter but
   ``self``/``cls`` (``*args`` and ``**kwargs`` one each), lines from ``def`` to the last
   line of the body. The exceptions are listed below, each with its reason.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = "sharding_store"
ROOT = Path(importlib.util.find_spec(PACKAGE).origin).parent  # the package under test (PYTHONPATH wins)

#: The module map of issue 13 (PLAN.md "Target layers"), bottom-up. A module may import its
#: own layer or lower ones. ``stores.*`` / ``cli.*`` stand for every module of the package.
LAYERS: dict[int, tuple[str, tuple[str, ...]]] = {
    0: ("native bindings and the zarr and numcodecs adapters (no package import)",
        ("codec", "codec._native", "_zarr_adapter", "_numcodecs_adapter", "_version")),
    1: ("format (pure, no I/O)",
        ("errors", "formats", "formats.keys", "formats.shard_index", "formats.fill_value", "formats.draft_metadata",
         "formats.v3_documents", "formats.gen2023", "formats.v3_layout", "formats.reshard_journal",
         "formats.upgrade_journal")),
    2: ("stores", ("stores", "stores.*", "stores.locks")),
    3: ("codecs", ("codec.chunk_codec", "codec.buffers")),
    4: ("shard engine", ("engine", "engine.shard_engine", "engine.store")),
    5: ("hierarchy and arrays", ("api", "api.hierarchy", "api.arrays", "api.v3view", "api.evidence")),
    6: ("jobs", ("ops", "ops.jobs", "ops.progress")),
    7: ("drivers",
        ("ops.options", "ops.migration", "ops.node_plan", "ops.units", "ops.destination", "ops.verification",
         "ops.reference_check", "ops.resharding", "ops.upgrade")),
    8: ("package facade (lazy re-exports of the public names)", ("",)),
    9: ("command line", ("cli", "cli.*", "__main__")),
    10: ("xarray backend (an entry point of xarray's; never imported by the package)", ("xarray_backend",)),
    11: ("test support (never imported by the package)", ("testing",)),
}
#: modules issue 13 retires, and where their contents went
RETIRED = {
    "inner": "the stores/ package (stores/base.py, local.py, fsspec.py, mapping.py, zarr.py)",
    "counting": "sharding_store/testing.py (CountingInner, out of the package namespace)",
    "retry": "ops/jobs.py (run_bounded, retries, fault points: one of each)",
}
#: modules the new map must have
REQUIRED = ("stores", "stores.base", "stores.local", "stores.fsspec_store", "stores.mapping", "stores.zarr_store",
            "testing", "formats.reshard_journal", "codec.chunk_codec", "codec._native", "engine.shard_engine", "engine.store", "ops.jobs")

#: where a store's concrete classes and private attributes may be used (``inner``/``counting``:
#: the old store layer, reported as retired by test_the_module_map_of_issue_13_exists)
STORE_LAYER = ("stores", "stores.*", "testing", "inner", "counting")
#: attributes that belong to a store's implementation (any object, outside the stores layer)
PRIVATE_STORE_ATTRIBUTES = {"_path", "_fs", "fs", "is_local", "call_s3"}
#: concrete store classes, besides every ``*Inner`` class defined in stores/ or testing.py
#: (the ``Inner`` protocol itself is the interface: checking it is allowed)
KNOWN_STORE_CLASSES = {"BaseInner", "LocalInner", "FsspecInner", "MappingInner", "ZarrStoreInner", "CountingInner"}

#: the only environment variables the package may read, and why
ENV_ALLOWED = {
    ("cli", "SHARDING_STORE_DEBUG"): "the CLI shows a traceback instead of one line (a user's switch, no test hook)",
    ("cli", "OPENBLAS_NUM_THREADS"): "the CLI sets numpy's BLAS to one thread unless the user chose (setdefault)",
    # obstore reads AWS_* settings from the environment, botocore some of them: an s3:// URL is
    # read through obstore only when the two would read the same (stores/_obstore.obstore_options)
    ("stores._obstore", "?"): "obstore: no AWS_* variable botocore could read differently is set",
    ("stores._obstore", "AWS_DEFAULT_REGION"): "obstore: the region botocore takes from the environment",
    ("stores._obstore", "AWS_CONFIG_FILE"): "obstore: botocore would read a region from a config file (s3fs)",
    ("stores._obstore", "AWS_ACCESS_KEY_ID"): "obstore: the credentials botocore's chain takes first",
    ("stores._obstore", "AWS_SECRET_ACCESS_KEY"): "obstore: the credentials botocore's chain takes first",
}
NATIVE = "codec._native"

#: issue 23's limits: parameters of a public function, lines of any function
MAX_PARAMETERS = 8
MAX_LINES = 80
#: functions allowed over a limit, by ``module:qualified name``, and why (empty is the goal)
SIZE_EXCEPTIONS: dict[str, str] = {}


# --------------------------------------------------------------------------- reading the source


@dataclass(frozen=True)
class Import:
    source: str        # importing module, relative to the package ("" = the package itself)
    target: str        # imported module, same spelling
    line: int
    where: str         # "module level", "in function f", "lazy re-export", ...
    type_only: bool    # under ``if TYPE_CHECKING:``

    def site(self) -> str:
        return f"{path_of(self.source)}:{self.line} ({self.where})"


@functools.cache
def modules() -> dict[str, Path]:
    """Every module of the package by short name: ``array``, ``stores.base``, ``cli``, ``""``."""
    out = {}
    for f in sorted(ROOT.rglob("*.py")):
        if "__pycache__" in f.parts:
            continue
        parts = list(f.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def path_of(module: str) -> str:
    return modules()[module].relative_to(ROOT.parent).as_posix()


def is_package(module: str) -> bool:
    return modules()[module].name == "__init__.py"


@functools.cache
def parse(module: str) -> ast.Module:
    f = modules()[module]
    return ast.parse(f.read_text(), filename=str(f))


def layer_of(module: str) -> int | None:
    """The layer that names ``module`` exactly, else the one whose ``folder.*`` holds it."""
    for n, (_, members) in LAYERS.items():
        if module in members:
            return n
    for n, (_, members) in LAYERS.items():
        for m in members:
            if m.endswith(".*") and module.startswith(m[:-1]):
                return n
    return None


def in_store_layer(module: str) -> bool:
    return any(module == m or (m.endswith(".*") and module.startswith(m[:-1])) for m in STORE_LAYER)


def _walk(node: ast.AST, where: str = "module level", type_only: bool = False) -> Iterator[tuple[ast.AST, str, bool]]:
    """Every node with the function it is in and whether it is under ``if TYPE_CHECKING:``."""
    todo = [(node, where, type_only)]
    while todo:
        parent, where, type_only = todo.pop()
        guarded = isinstance(parent, ast.If) and _is_type_checking(parent.test)
        body = {id(n) for n in parent.body} if guarded else set()
        for child in ast.iter_child_nodes(parent):
            w, t = where, type_only or id(child) in body
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                w = f"in function {child.name}"
            elif isinstance(child, ast.Lambda):
                w = "in a lambda"
            yield child, w, t
            todo.append((child, w, t))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _absolute(module: str, level: int, name: str | None) -> str | None:
    """``from {'.' * level}{name} import ...`` inside ``module`` -> package-relative name, or
    None for an import from outside the package."""
    if level == 0:
        if name is None or not (name == PACKAGE or name.startswith(PACKAGE + ".")):
            return None
        return name[len(PACKAGE) + 1:]
    parts = module.split(".") if module else []
    base = parts if is_package(module) else parts[:-1]
    if level - 1 > len(base):
        return None
    base = base[: len(base) - (level - 1)]
    if name:
        base = base + name.split(".")
    return ".".join(base)


def _known(target: str, mods: dict[str, Path]) -> str | None:
    """The module a dotted target names (a submodule, else the longest existing prefix)."""
    parts = target.split(".") if target else []
    while True:
        name = ".".join(parts)
        if name in mods:
            return name
        if not parts:
            return None
        parts.pop()


@functools.cache
def imports_of(module: str) -> list[Import]:
    mods = modules()
    out: list[Import] = []
    tree = parse(module)
    for node, where, type_only in _walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _absolute(module, 0, alias.name)
                if target is not None and (t := _known(target, mods)) is not None:
                    out.append(Import(module, t, node.lineno, where, type_only))
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, node.level, node.module)
            if base is None:
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}" if base else alias.name
                t = sub if sub in mods else _known(base, mods)
                if t is not None:
                    out.append(Import(module, t, node.lineno, where, type_only))
        elif isinstance(node, ast.Call) and _is_import_module(node.func) and node.args:
            for t in _dynamic_targets(module, node.args[0], mods):
                out.append(Import(module, t, node.lineno, f"{where}, importlib.import_module", type_only))
    if module == "":
        out += lazy_exports()
    return [i for i in out if i.target != i.source]


def _is_import_module(func: ast.expr) -> bool:
    return (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id == "import_module")


def _dynamic_targets(module: str, arg: ast.expr, mods: dict[str, Path]) -> list[str]:
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        target = _absolute(module, 0, arg.value)
        return [t] if target is not None and (t := _known(target, mods)) is not None else []
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.FormattedValue) \
            and isinstance(arg.values[0].value, ast.Name) and arg.values[0].value.id == "__name__":
        if module == "":
            return []  # the facade: its precise targets are _EXPORTS (lazy_exports)
        prefix = module + "."
        return [m for m in mods if m.startswith(prefix) and "." not in m[len(prefix):]
                and not m.endswith("__main__")]
    return []


def lazy_exports() -> list[Import]:
    """The package ``__init__``'s lazy re-exports: ``_EXPORTS`` maps public name -> module."""
    tree = parse("")
    lazy = any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in ast.walk(tree))
    exports = [n for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign))
               and any(isinstance(t, ast.Name) and t.id == "_EXPORTS"
                       for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))]
    if not lazy:
        return []
    assert exports, (f"{path_of('')} re-exports lazily (__getattr__) but has no _EXPORTS table: "
                     "this test cannot see what it imports; name the targets in _EXPORTS")
    out = []
    for node in exports:
        for value in _export_modules(node.value):
            out.append(Import("", _known(value, modules()) or value, node.lineno, "lazy re-export (_EXPORTS)", False))
    return out


def _export_modules(node: ast.expr | None) -> set[str]:
    """Module names in ``{"name": "module", **dict.fromkeys([...], "module")}``."""
    found: set[str] = set()
    if isinstance(node, ast.Dict):
        for v in node.values:
            if isinstance(v, ast.Constant) and isinstance(v.value, str):
                found.add(v.value)
            elif isinstance(v, ast.Call) and len(v.args) == 2 and isinstance(v.args[1], ast.Constant):
                found.add(v.args[1].value)
            else:
                found |= _export_modules(v)
    return found


def import_graph(*, type_only: bool) -> dict[str, list[Import]]:
    """module -> its imports of other package modules (``type_only``: include TYPE_CHECKING ones)."""
    return {m: [i for i in imports_of(m) if type_only or not i.type_only] for m in modules()}


def _cycles(graph: dict[str, list[Import]]) -> list[tuple[set[str], list[Import]]]:
    """Per strongly connected component (Tarjan): its modules and one shortest cycle through
    its first module, as the imports along it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    sccs: list[set[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for imp in graph.get(v, []):
            w = imp.target
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1 or any(i.target == v for i in graph.get(v, [])):
                sccs.append(comp)

    for v in sorted(graph):
        if v not in index:
            strong(v)
    out = []
    for comp in sccs:
        start = min(comp)
        # breadth-first from start back to start inside the component
        paths: dict[str, list[Import]] = {start: []}
        queue = [start]
        found: list[Import] | None = None
        while queue and found is None:
            v = queue.pop(0)
            for imp in sorted(graph.get(v, []), key=lambda i: (i.target, i.line)):
                if imp.target == start:
                    found = paths[v] + [imp]
                    break
                if imp.target in comp and imp.target not in paths:
                    paths[imp.target] = paths[v] + [imp]
                    queue.append(imp.target)
        out.append((comp, found or []))
    return out


def _name(module: str) -> str:
    return PACKAGE + ("." + module if module else "")


# --------------------------------------------------------------------------- 1. layers and cycles


def test_every_module_has_a_place_in_the_layer_table():
    unplaced = [m for m in modules() if layer_of(m) is None]
    lines = []
    for m in unplaced:
        why = f"retired by issue 13: its contents belong in {RETIRED[m]}" if m in RETIRED else \
            "add it to LAYERS here and to the module map in PLAN.md/README"
        lines.append(f"  {path_of(m)}: {why}")
    assert not unplaced, "modules outside the layer map of issue 13:\n" + "\n".join(lines)


def test_the_module_map_of_issue_13_exists():
    mods = modules()
    missing = [m for m in REQUIRED if m not in mods]
    retired = [m for m in RETIRED if m in mods]
    assert not missing and not retired, "\n".join(
        [f"  missing: {_name(m)}" for m in missing]
        + [f"  still present: {path_of(m)} (its contents belong in {RETIRED[m]})" for m in retired])


def test_no_import_cycle_even_through_imports_inside_functions():
    cycles = _cycles(import_graph(type_only=False))
    text = []
    for comp, cycle in cycles:
        chain = " -> ".join([_name(cycle[0].source)] + [_name(i.target) for i in cycle])
        sites = "\n".join(f"      {_name(i.source)} imports {_name(i.target)} at {i.site()}" for i in cycle)
        text.append(f"  {chain}\n{sites}")
        if len(comp) > len(cycle):
            text.append(f"    (one cycle of a knot of {len(comp)} modules: {', '.join(sorted(map(_name, comp)))})")
    assert not cycles, f"{len(cycles)} import cycle(s) among {PACKAGE} modules:\n" + "\n".join(text)


def test_a_lower_layer_never_imports_a_higher_one():
    bad = []
    for module, imps in import_graph(type_only=True).items():
        src = layer_of(module)
        for i in imps:
            dst = layer_of(i.target)
            if src is not None and dst is not None and dst > src:
                bad.append(f"  {_name(module)} (layer {src}, {LAYERS[src][0]}) imports {_name(i.target)} "
                           f"(layer {dst}, {LAYERS[dst][0]}) at {i.site()}"
                           + (" [TYPE_CHECKING]" if i.type_only else ""))
    assert not bad, "imports against the layer order (a lower layer never imports a higher one):\n" + "\n".join(bad)


def test_the_graph_builder_sees_function_level_relative_and_lazy_imports():
    """The checks above can fail: the graph holds the edges they are about."""
    graph = {m: {i.target for i in imps} for m, imps in import_graph(type_only=False).items()}
    assert graph[""] >= {"api.arrays", "errors", "ops.migration", "ops.verification", "api.v3view"}, graph[""]  # _EXPORTS
    imps = [i for imps in import_graph(type_only=True).values() for i in imps]
    assert any(i.where.startswith("in function") for i in imps)
    assert any(i.type_only for i in imps) or not any(
        "TYPE_CHECKING" in p.read_text() for p in modules().values())
    # a synthetic cycle through a function-level import is reported with its sites
    fake = {"a": [Import("a", "b", 1, "module level", False)],
            "b": [Import("b", "a", 9, "in function f", False)], "c": []}
    ((comp, cycle),) = _cycles(fake)
    assert comp == {"a", "b"}
    assert [(i.source, i.target, i.where) for i in cycle] == [("a", "b", "module level"), ("b", "a", "in function f")]


# --------------------------------------------------------------------------- 2. store internals


def _store_classes() -> set[str]:
    names = set(KNOWN_STORE_CLASSES)
    for m in modules():
        if in_store_layer(m):
            names |= {n.name for n in ast.walk(parse(m))
                      if isinstance(n, ast.ClassDef) and n.name.endswith("Inner") and n.name != "Inner"}
    return names


def _class_names(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Tuple):
        return [n for e in node.elts for n in _class_names(e)]
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    return []


def _mentions_inner(node: ast.expr) -> bool:
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return "inner" in name.lower()


def test_no_concrete_store_class_or_private_store_attribute_outside_the_stores_layer():
    classes = _store_classes()
    bad = []
    for m in modules():
        if in_store_layer(m):
            continue
        for node, where, _ in _walk(parse(m)):
            site = f"{path_of(m)}:{getattr(node, 'lineno', '?')} ({where})"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in ("isinstance", "issubclass") and len(node.args) == 2:
                hit = sorted(set(_class_names(node.args[1])) & classes)
                if hit:
                    bad.append(f"  {site}: {node.func.id}(..., {', '.join(hit)}) - ask the store (a capability method)")
            elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Call) \
                    and isinstance(node.left.func, ast.Name) and node.left.func.id == "type":
                hit = sorted({n for c in node.comparators for n in _class_names(c)} & classes)
                if hit:
                    bad.append(f"  {site}: type(...) compared with {', '.join(hit)}")
            elif isinstance(node, ast.Attribute):
                if node.attr in PRIVATE_STORE_ATTRIBUTES:
                    bad.append(f"  {site}: .{node.attr} - a store's implementation detail")
                elif node.attr == "root" and _mentions_inner(node.value):
                    bad.append(f"  {site}: .root of a store - use location()/describe()")
                elif node.attr.startswith("_") and not node.attr.startswith("__") and _mentions_inner(node.value):
                    bad.append(f"  {site}: .{node.attr} - a private attribute of a store")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2 \
                    and isinstance(node.args[1], ast.Constant) and node.args[1].value in PRIVATE_STORE_ATTRIBUTES:
                bad.append(f"  {site}: {node.func.id}(..., {node.args[1].value!r}) - a store's implementation detail")
    bad.sort(key=lambda b: (b.split(":")[0], int(b.split(":")[1].split(" ")[0])))
    assert not bad, ("store internals used outside sharding_store/stores/ and sharding_store/testing.py "
                     f"({len(bad)}):\n" + "\n".join(bad))


# --------------------------------------------------------------------------- 3. environment hooks


def _module_strings(tree: ast.Module) -> dict[str, str]:
    """Module-level ``NAME = "string"`` constants (env-var names are often spelled so)."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = node.value.value
    return out


def _env_uses(module: str) -> list[tuple[int, str, str]]:
    """(line, variable or '?', how) for every read or write of the process environment."""
    tree = parse(module)
    consts = _module_strings(tree)

    def key(node: ast.expr | None) -> str:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name) and node.id in consts:
            return consts[node.id]
        return "?"

    from_os = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "os"
               for a in n.names if a.name in ("environ", "environb", "getenv", "getenvb", "putenv", "unsetenv")}
    out = []
    parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    for node in ast.walk(tree):
        environ = (isinstance(node, ast.Attribute) and node.attr in ("environ", "environb")
                   and isinstance(node.value, ast.Name) and node.value.id == "os") or (
            isinstance(node, ast.Name) and node.id in from_os & {"environ", "environb"})
        getenv = (isinstance(node, ast.Attribute) and node.attr in ("getenv", "getenvb", "putenv", "unsetenv")
                  and isinstance(node.value, ast.Name) and node.value.id == "os") or (
            isinstance(node, ast.Name) and node.id in from_os - {"environ", "environb"})
        if not (environ or getenv):
            continue
        parent = parents.get(node)
        name = "?"
        if getenv and isinstance(parent, ast.Call) and parent.func is node and parent.args:
            name = key(parent.args[0])
        elif environ and isinstance(parent, ast.Subscript):
            name = key(parent.slice)
        elif environ and isinstance(parent, ast.Attribute) and isinstance(parents.get(parent), ast.Call):
            call = parents[parent]
            name = key(call.args[0]) if call.args else "?"
        elif environ and isinstance(parent, ast.Compare):
            name = key(parent.left)
        out.append((node.lineno, name, ast.unparse(parent if parent is not None else node)[:80]))
    return out


def test_no_environment_variable_hook_in_the_package():
    bad = []
    for m in modules():
        for line, name, how in _env_uses(m):
            if (m, name) not in ENV_ALLOWED:
                bad.append(f"  {path_of(m)}:{line}: {name} ({how})")
    assert not bad, ("the package reads the environment outside the allow-list (a test hook belongs in a "
                     "parameter or sharding_store/testing.py, issue 13):\n" + "\n".join(bad))


def test_no_test_hook_name_in_the_package():
    bad = []
    for m, _f in modules().items():
        for node in ast.walk(parse(m)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and re.search(r"SHARDING_STORE_TEST_", node.value):
                bad.append(f"  {path_of(m)}:{node.lineno}: {node.value[:60]!r}")
    assert not bad, "test-hook names in the package:\n" + "\n".join(bad)


def test_the_environment_allow_list_is_used_and_the_scanner_sees_reads():
    """Each allowed entry still exists (else drop it), and the scanner finds a read at all."""
    seen = {(m, name) for m in modules() for _, name, _ in _env_uses(m)}
    assert set(ENV_ALLOWED) <= seen, f"allowed but gone (remove from ENV_ALLOWED): {set(ENV_ALLOWED) - seen}"


# --------------------------------------------------------------------------- 4. test helpers out of the namespace


def test_counting_is_not_in_the_package_namespace():
    import sharding_store

    assert not (ROOT / "counting.py").exists(), "sharding_store/counting.py still exists (move it to testing.py)"
    assert importlib.util.find_spec("sharding_store.counting") is None, "sharding_store.counting is importable"
    assert "counting" not in dir(sharding_store) and "CountingInner" not in dir(sharding_store)
    assert "CountingInner" not in getattr(sharding_store, "__all__", [])


def test_counting_inner_lives_in_the_testing_module():
    assert (ROOT / "testing.py").is_file(), "sharding_store/testing.py does not exist"
    testing = importlib.import_module("sharding_store.testing")
    counting = getattr(testing, "CountingInner", None)
    assert isinstance(counting, type), "sharding_store.testing.CountingInner missing"
    importers = [i.site() for m, imps in import_graph(type_only=True).items() for i in imps
                 if i.target == "testing" and m != "testing"]
    assert not importers, f"package modules import sharding_store.testing: {importers}"


# --------------------------------------------------------------------------- 5. native bindings behind one door


def test_only_the_native_module_binds_compiled_libraries():
    bad = []
    for m in modules():
        if m == NATIVE:
            continue
        for node, where, _ in _walk(parse(m)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            if any(n == "ctypes" or n.startswith("ctypes.") for n in names):
                bad.append(f"  {path_of(m)}:{node.lineno} ({where})")
    assert not bad, f"ctypes imported outside {path_of(NATIVE)}:\n" + "\n".join(bad)


#: what takes a raw memory address from a numpy array (issue 23: only ``_native`` may)
RAW_ADDRESS = re.compile(r"\.ctypes\.data\b|\.ctypes\.data_as\b|__array_interface__|\.buffer_info\(\)\[0\]")


def raw_address_uses(text: str) -> list[int]:
    """Line numbers of ``text`` that take an array's raw address (see :data:`RAW_ADDRESS`)."""
    return [n for n, line in enumerate(text.splitlines(), 1) if RAW_ADDRESS.search(line.split("#", 1)[0])]


def test_no_raw_address_outside_the_native_module():
    """Raw addresses are taken in ``codec/_native.py`` only (``data_address``, ``madvise_array``,
    ``same_bytes``, ``align_skip``): no ``arr.ctypes.data`` anywhere else in the package."""
    bad = [f"  {path_of(m)}:{n}" for m in modules() if m != NATIVE
           for n in raw_address_uses(modules()[m].read_text())]
    assert not bad, f"raw addresses taken outside {path_of(NATIVE)}:\n" + "\n".join(bad)


def test_the_raw_address_scanner_sees_every_spelling():
    text = "a = x.ctypes.data\nb = y.__array_interface__['data'][0]\n# z.ctypes.data in a comment\nc = t.buffer_info()[0]\n"
    assert raw_address_uses(text) == [1, 2, 4]


#: private APIs of s3fs, fsspec and zarr (issue 23), and the one adapter module allowed to use each
PRIVATE_APIS = {
    "s3fs": (re.compile(r"""(\.|["'])(_call_s3|_exists|_iterdir)\b"""), "stores._s3fs_adapter"),
    "fsspec": (re.compile(r"""(\.|["'])_strip_protocol\b"""), "stores._fsspec_adapter"),
    "zarr": (re.compile(r"""\bzarr\.core\b|(\.|["'])_is_open\b|super\(\)\._open\("""), "_zarr_adapter"),
}


def private_api_uses(text: str) -> list[tuple[int, str]]:
    """``(line, library)`` for every use of another library's private API in ``text``."""
    return [(n, lib) for n, line in enumerate(text.splitlines(), 1) for lib, (pattern, _) in PRIVATE_APIS.items()
            if pattern.search(line.split("#", 1)[0])]


def test_private_apis_of_other_libraries_only_in_their_adapter():
    """s3fs's ``_call_s3``/``_exists``/``_iterdir``, fsspec's ``_strip_protocol``, zarr's
    ``zarr.core``/``_is_open``/``Store._open``: each only in its library's adapter module."""
    bad = [f"  {path_of(m)}:{n} ({lib}: only in {PRIVATE_APIS[lib][1]})" for m in modules()
           for n, lib in private_api_uses(modules()[m].read_text()) if m != PRIVATE_APIS[lib][1]]
    assert not bad, "private API of another library outside its adapter:\n" + "\n".join(bad)


def test_the_private_api_scanner_sees_every_spelling():
    text = ("await fs._call_s3('get_object')\nhasattr(fs, '_iterdir')\np = fs._strip_protocol(x)\n"
            "from zarr.core.sync import sync\nawait super()._open()\nstate['_is_open']\nstrip_protocol(fs, x)\n")
    assert private_api_uses(text) == [(1, "s3fs"), (2, "s3fs"), (3, "fsspec"), (4, "zarr"), (5, "zarr"), (6, "zarr")]


@pytest.mark.parametrize("module", ["", "cli"])
def test_packages_in_the_graph_resolve(module):
    """``from . import x`` inside a package resolves against the package itself."""
    assert is_package(module)
    assert _absolute(module, 1, "errors") == ("errors" if module == "" else "cli.errors")
    assert _absolute("cli.info", 2, "errors") == "errors" and _absolute("cli.info", 1, None) == "cli"


# --------------------------------------------------------------------------- function sizes (issue 23)


@dataclass(frozen=True)
class Function:
    module: str
    name: str          # qualified: ``Class.method``, ``outer.inner``
    line: int
    parameters: int    # every one but self/cls; *args and **kwargs one each
    lines: int         # from ``def`` to the last line of the body
    public: bool       # part of the package's API: no private module, class or function on its path

    @property
    def where(self) -> str:
        return f"{path_of(self.module)}:{self.line} {self.name}"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def functions_of(module: str) -> list[Function]:
    """Every function and method of ``module``, nested ones included."""
    return functions_in(parse(module), module)


def functions_in(tree: ast.Module, module: str) -> list[Function]:
    module_private = any(_private(part) for part in module.split(".") if part)
    out: list[Function] = []

    def visit(node: ast.AST, prefix: str, public: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".", public and not _private(child.name))
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = child.args
                names = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs] + [
                    p.arg for p in (a.vararg, a.kwarg) if p is not None]
                count = len([n for n in names if n not in ("self", "cls")])
                out.append(Function(module, prefix + child.name, child.lineno, count,
                                    child.end_lineno - child.lineno + 1, public and not _private(child.name)))
                visit(child, prefix + child.name + ".", False)  # a nested function is never public

    visit(tree, "", not module_private)
    return out


def size_violations() -> dict[str, str]:
    """``module:name`` -> what is over a limit, for every function of the package."""
    out = {}
    for module in modules():
        for f in functions_of(module):
            over = []
            if f.public and f.parameters > MAX_PARAMETERS:
                over.append(f"{f.parameters} parameters (public; at most {MAX_PARAMETERS})")
            if f.lines > MAX_LINES:
                over.append(f"{f.lines} lines (at most {MAX_LINES})")
            if over:
                out[f"{module}:{f.name}"] = f"{f.where}: " + ", ".join(over)
    return out


def test_no_public_function_over_8_parameters_and_no_function_over_80_lines():
    found = size_violations()
    new = {k: v for k, v in found.items() if k not in SIZE_EXCEPTIONS}
    assert not new, "over issue 23's limits (split it, or bundle options in a record):\n" + "\n".join(new.values())
    stale = sorted(set(SIZE_EXCEPTIONS) - set(found))
    assert not stale, f"listed as exceptions but within the limits now: remove them from SIZE_EXCEPTIONS: {stale}"


def test_the_size_counter_counts_as_the_issue_does():
    """Parameters without self/cls, ``*args``/``**kwargs`` one each; nested functions count
    for length but are never public; private modules, classes and functions are not public."""
    tree = ast.parse(
        "class A:\n"
        "    def __init__(self, a, b, *c, d, **e):\n"
        "        def inner(x, y, z, p, q, r, s, t, u):\n"
        "            pass\n"
        + "".join("        x = 1\n" for _ in range(78)) +
        "class _B:\n"
        "    def m(self, a, b, c, d, e, f, g, h, i):\n"
        "        pass\n"
        "def _f(a, b, c, d, e, f, g, h, i):\n"
        "    pass\n"
        "def g(a, b, c, d, e, f, g, h, /, i):\n"
        "    pass\n"
    )
    got = {f.name: (f.parameters, f.lines, f.public) for f in functions_in(tree, "probe")}
    assert {f.public for f in functions_in(tree, "stores._probe")} == {False}  # a private module
    assert got == {
        "A.__init__": (5, 81, True),
        "A.__init__.inner": (9, 2, False),
        "_B.m": (9, 2, False),
        "_f": (9, 2, False),
        "g": (9, 2, True),
    }


# ----------------------------------------- 7. the generation is the readers' business (issue 23)

#: the names that tell generations apart (the enum's draft members, the 2023 reader's
#: classes and functions, the removed per-generation planner module)
GENERATION_NAMES = ("Generation.DRAFT_2023", "Generation.DRAFT_2022", "Hierarchy2023", "hierarchy_2023",
                    "is_draft_2023", "migrate2023")
#: the generation readers, where the generation is decided, each with its reason
GENERATION_READERS = {
    "api.hierarchy": "detect_generation and node_model pick the reader; the models say what their "
                                "generation allows (writable, upgradable_in_place, era, label)",
    "formats.gen2023": "the 2023 generation's node documents",
    "formats.draft_metadata": "the 2022 generation's documents",
    "formats.v3_layout": "final/2023 array documents translated for the reader",
}


def test_no_module_outside_the_generation_readers_names_the_generation() -> None:
    """Done when of issue 23: every other module works on the node model (``hierarchy.node_model``,
    ``walked_model``) and asks it, never which generation a store is."""
    offenders = []
    for module, path in modules().items():
        if module in GENERATION_READERS:
            continue
        text = path.read_text()
        offenders += [f"{path_of(module)}: {name}" for name in GENERATION_NAMES if name in text]
    assert not offenders, offenders
    assert set(GENERATION_READERS) <= set(modules())


# --------------------------------------------------------------------------- 7. the layout shows the layers


#: each folder of the package and the layers its modules are in (issue 23: a newcomer reads
#: the layers from the folders); a module at the top level is one of its own
FOLDERS: dict[str, set[int]] = {
    "formats": {1}, "stores": {2}, "codec": {0, 3}, "engine": {4}, "api": {5}, "ops": {6, 7}, "cli": {9},
}
#: our dependencies' import names: a module named like one shadows it for a reader
DEPENDENCIES = {"zarr", "fsspec", "numcodecs", "numpy", "crc32c", "tqdm", "s3fs", "obstore", "botocore", "dask",
                "distributed", "xarray", "tensorstore", "zarrs", "psutil", "zstandard"}


def test_every_folder_holds_the_layers_it_stands_for():
    bad = []
    for m in modules():
        folder = m.split(".")[0] if "." in m or (m and is_package(m)) else None
        if folder is None:
            continue
        assert folder in FOLDERS, f"{path_of(m)}: a new folder; add it to FOLDERS (and to the README table)"
        if layer_of(m) not in FOLDERS[folder]:
            bad.append(f"  {path_of(m)}: layer {layer_of(m)}, its folder {folder}/ holds layers {FOLDERS[folder]}")
    assert not bad, "modules in a folder of another layer:\n" + "\n".join(bad)


def _bound_names(module: str) -> set[str]:
    """Names a package's ``__init__`` binds (defines, assigns, imports as something other than
    its submodule), and for the facade its lazy public names."""
    tree = parse(module)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.ImportFrom) and node.level == 1 and node.module is None:
            continue  # ``from . import sub``: the submodule itself
        elif isinstance(node, ast.ImportFrom):
            names |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    if module == "":
        names |= set(importlib.import_module(PACKAGE).__all__)
    return names


def test_no_module_shadows_a_function_the_standard_library_or_a_dependency():
    """``sharding_store.migrate`` was a function and a module, ``inspect`` and ``array`` were
    names of the standard library, ``stores/zarr.py`` of a dependency (issue 23)."""
    bad = []
    for m in modules():
        if not m:
            continue
        parent, _, leaf = m.rpartition(".")
        if leaf.startswith("__"):
            continue
        if leaf in sys.stdlib_module_names:
            bad.append(f"  {path_of(m)}: '{leaf}' is a standard-library module")
        if leaf in DEPENDENCIES:
            bad.append(f"  {path_of(m)}: '{leaf}' is a dependency's package")
        if leaf in _bound_names(parent):
            bad.append(f"  {path_of(m)}: '{leaf}' is also a name its package {_name(parent)} binds")
    assert not bad, "module names that shadow something:\n" + "\n".join(bad)


def test_the_shadow_check_sees_a_shadow():
    assert "inspect" in sys.stdlib_module_names and "array" in sys.stdlib_module_names
    assert "migrate" in _bound_names("") and "verify" in _bound_names("")


README = ROOT.parent / "docs" / "architecture.md"  # the module table (README links it)


def readme_module_table() -> list[tuple[int, str]]:
    """(layer, module path under the package) for every row of the README's module table;
    a row with an empty layer cell is in the layer of the row above."""
    text = README.read_text()
    m = re.search(r"\| layer \| module \| what it holds \|\n\|---\|---\|---\|\n((?:\|.*\|\n)+)", text)
    assert m, "docs/architecture.md: the module table (| layer | module | what it holds |) is missing"
    rows, layer = [], None
    for row in m.group(1).splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if cells[0]:
            layer = int(cells[0].split()[0])
        for name in re.findall(r"`([\w/]+\.py)`", cells[1]):
            rows.append((layer, name))
    return rows


def _listed_modules() -> dict[str, str]:
    """module path under the package -> module name, for every module the table must list
    (a folder's ``__init__.py`` holding nothing but its docstring is the folder's title)."""
    out = {}
    for m, f in modules().items():
        tree = parse(m)
        trivial = all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in tree.body)
        if f.name == "__init__.py" and m and trivial:
            continue
        out[f.relative_to(ROOT).as_posix()] = m
    return out


def test_the_readme_module_table_lists_exactly_the_modules_in_their_layers():
    rows = readme_module_table()
    listed = [name for _, name in rows]
    expected = _listed_modules()
    assert sorted(listed) == sorted(set(listed)), f"listed twice: {sorted({n for n in listed if listed.count(n) > 1})}"
    missing, extra = sorted(set(expected) - set(listed)), sorted(set(listed) - set(expected))
    assert not missing and not extra, f"docs/architecture.md module table: missing {missing}, not in the package {extra}"
    wrong = [f"  {name}: docs/architecture.md says layer {n}, LAYERS says {layer_of(expected[name])}"
             for n, name in rows if layer_of(expected[name]) != n]
    assert not wrong, "docs/architecture.md module table against LAYERS:\n" + "\n".join(wrong)


#: tests of the package as a whole, at the top of tests/ (every other test is in a folder)
PACKAGE_WIDE_TESTS = {"test_architecture", "test_package", "test_startup_imports", "test_install", "test_readme"}


def test_the_tests_mirror_the_package_folders():
    """``tests/unit/<folder>/`` for folders of the package only, ``tests/integration/``,
    and no test module loose at the top but the package-wide ones."""
    tests = Path(__file__).resolve().parent
    unit = {p.name for p in (tests / "unit").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert unit <= set(FOLDERS), f"tests/unit/ folders that are no package folder: {sorted(unit - set(FOLDERS))}"
    loose = sorted(p.name for p in tests.glob("test_*.py") if p.stem not in PACKAGE_WIDE_TESTS)
    assert not loose, f"test modules at the top of tests/ (put them in tests/unit/<folder>/ or tests/integration/): {loose}"
    for folder in [tests / "unit", tests / "integration", *(tests / "unit" / u for u in unit)]:
        assert (folder / "__init__.py").is_file(), f"{folder} is no package (tests import each other as tests.x.y)"
