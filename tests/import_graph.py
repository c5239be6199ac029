"""The module import graph of the project's packages, read from the sources with ``ast``.

Nodes are modules (``runtime.ops.math``; a package is its ``__init__``: ``runtime.ops``). An edge
``a -> b`` is an import statement in ``a`` that names ``b``, wherever it stands: top level, inside a
function, under ``if TYPE_CHECKING:``; absolute or relative; ``from pkg import name`` names the
submodule ``pkg.name`` when there is one, else ``pkg``; ``import a.b.c`` names ``a.b.c``.

Two kinds of imports are left out, on purpose:
  * the parent packages Python runs first (``import a.b.c`` also runs ``a/__init__`` and
    ``a/b/__init__``): counting them would join every package with each of its submodules;
  * imports inside a function of a package ``__init__`` (the PEP 562 ``__getattr__`` and thin
    forwarding functions): these are lazy re-exports that run when a caller asks for the name, after
    the package has been imported, and point out of the package's facade, not into the code that
    defines it. A package ``__init__``'s top-level imports count. ``facade_functions`` narrows this to
    the functions so named (the layer check skips only ``__getattr__``: tests/test_import_graph.py).
Imports by string (``importlib.import_module``) are not seen.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Collection, Dict, Iterator, List, Optional, Sequence, Tuple

Graph = Dict[str, Dict[str, int]]  # module -> {imported module: line of the first such import}


def module_files(root: Path, packages: Sequence[str]) -> Dict[str, Tuple[Path, bool]]:
    """Dotted module name -> (file, is a package ``__init__``) for every .py file under ``packages``."""
    out: Dict[str, Tuple[Path, bool]] = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def _statements(tree: ast.Module, is_pkg: bool, facade: Optional[Collection[str]] = None) -> Iterator[ast.stmt]:
    """The import statements that count (a package ``__init__``'s function bodies are skipped: all of
    them, or those named in ``facade``)."""
    todo: List[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        for child in ast.iter_child_nodes(node):
            if is_pkg and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    (facade is None or child.name in facade):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child
            todo.append(child)


def _known(name: str, modules: Dict[str, Tuple[Path, bool]]) -> Optional[str]:
    """``name`` or its nearest enclosing module that is one of ``modules`` (None: another package)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(root: Path, packages: Sequence[str], facade_functions: Optional[Collection[str]] = None) -> Graph:
    """Every module under ``packages`` with the project modules it imports (see the module doc);
    ``facade_functions``: the only functions of a package ``__init__`` whose imports are left out
    (default: all of them)."""
    modules = module_files(root, packages)
    graph: Graph = {}
    for name, (path, is_pkg) in modules.items():
        here = name if is_pkg else name.rpartition(".")[0]  # what `from . import` is relative to
        edges: Dict[str, int] = {}
        tree = ast.parse(path.read_text(), str(path))
        for stmt in sorted(_statements(tree, is_pkg, facade_functions), key=lambda s: s.lineno):
            targets: List[Optional[str]] = []
            if isinstance(stmt, ast.Import):
                targets = [_known(a.name, modules) for a in stmt.names]
            else:
                if stmt.level:
                    base = here.split(".")[:len(here.split(".")) - (stmt.level - 1)]
                    source = ".".join(base + ([stmt.module] if stmt.module else []))
                else:
                    source = stmt.module or ""
                for a in stmt.names:
                    sub = f"{source}.{a.name}"
                    targets.append(sub if sub in modules else _known(source, modules))
            for t in targets:
                if t is not None and t != name:
                    edges.setdefault(t, stmt.lineno)
        graph[name] = edges
    return graph


def strongly_connected(graph: Graph) -> List[List[str]]:
    """The strongly connected components (Tarjan's algorithm, iterative), each sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack = set()
    out: List[List[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, {})))))
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


def a_cycle(graph: Graph, component: Sequence[str]) -> List[str]:
    """One cycle through ``component``'s first module, as ``module:line -> ...`` steps (shortest, BFS)."""
    members = set(component)
    start = component[0]
    parent: Dict[str, str] = {}
    frontier = [start]
    while frontier and start not in parent:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w in members and w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    path = [start]
    while True:
        prev = parent[path[-1]]
        if prev == start:
            break
        path.append(prev)
    path.append(start)
    path.reverse()  # start -> ... -> start
    return [f"{a} (line {graph[a][b]}) -> {b}" for a, b in zip(path, path[1:])]
