"""Where the runtime consults jit's tracer (issue 34, item 4): one op-entry protocol, at most 3 files.

Outside ``runtime/jit/`` and ``runtime/graph/`` only the op-entry protocol (``runtime/ops/op_entry.py``),
``Primitive.call`` (which inlines its check) and ``runtime/_native.py`` (what the C++ op entry reads) may
read the tracer. Every other op kind and every trace break declares itself with the protocol's decorators
(``@op_entry``, ``@breaks_trace``), which may only decorate. Read from the source with ``ast``, measuring
the real files: a module consults the tracer when it imports jit's tracing modules, reads a ``.tracer``,
or uses a function of another runtime module that does (``tracing()``, ``trace_break()`` of old).
"""
import ast
import functools
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

import pytest

import runtime

ROOT = Path(runtime.__file__).parent
TRACER_MODULES = ("runtime.jit.tracing", "runtime.jit.capture")  # capture.py: the Tracer class
OWN = ("jit", "graph")  # the tracer's own packages
PROTOCOL = "runtime.ops.op_entry"
DECLARATIONS = ("op_entry", "breaks_trace", "unary_method")  # the protocol's declarations: a module declares, never asks
ALLOWED = {"ops/op_entry.py", "ops/primitive.py", "_native.py"}  # the protocol, Primitive.call, the C++ entry


def _module_of(path: Path) -> List[str]:
    parts = ["runtime", *path.relative_to(ROOT).with_suffix("").parts]
    return parts[:-1] if parts[-1] == "__init__" else parts


def _is_tracer_module(name: str) -> bool:
    return any(name == m or name.startswith(m + ".") for m in TRACER_MODULES)


def _imports(tree: ast.AST, path: Path) -> List[Tuple[ast.AST, str, str, str]]:
    """(node, module, name, bound as) for every ``from module import name as bound`` in ``tree``, and
    (node, module, "", bound as) for every ``import module as bound``."""
    package = _module_of(path)
    if path.name != "__init__.py":
        package = package[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            mod = ".".join(base + (node.module.split(".") if node.module else []))
            found += [(node, mod, a.name, a.asname or a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(node, a.name, "", a.asname or a.name.split(".")[0]) for a in node.names]
    return found


def _hooks(tree: ast.AST, path: Path, known: Dict[str, Set[str]]) -> Set[str]:
    """The names of ``path``'s module that consult the tracer: those bound to a tracer module's object,
    or re-exporting another module's hook, and its module-level functions that read the tracer (a
    ``.tracer``, a tracer module's object, a hook function of this module); not the protocol's
    declarations. A function calling another module's hook makes its module consult, not itself a hook
    (calling ``ops.assign``, which stops a trace, is calling an op)."""
    seeds, names = set(), set()
    for _, mod, name, bound in _imports(tree, path):
        if _is_tracer_module(mod) or _is_tracer_module(f"{mod}.{name}"):
            seeds.add(bound)
        elif name in known.get(mod, ()):
            names.add(bound)
    grew = True
    while grew:  # a function calling a hook of its own module is one too
        grew = False
        for node in getattr(tree, "body", []):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name not in seeds:
                if node.name in DECLARATIONS and ".".join(_module_of(path)) == PROTOCOL:
                    continue
                if any((isinstance(n, ast.Name) and n.id in seeds) or (isinstance(n, ast.Attribute) and
                                                                          n.attr == "tracer")
                       for n in ast.walk(node)):
                    seeds.add(node.name)
                    grew = True
    return seeds | names


def _consults(path: Path, source: Optional[str] = None, known: Optional[Dict[str, Set[str]]] = None) -> List[str]:
    """How ``path`` (or ``source`` placed there) reaches the tracer: imports of its modules or of another
    module's hooks (``known``: module -> its hook names), ``.tracer`` reads, import-by-name calls, and the
    protocol's declarations used other than as decorators."""
    tree = ast.parse(path.read_text() if source is None else source, str(path))
    known = _scan_hooks() if known is None else known
    found = []
    modules = {}  # a name bound to a module: its attribute reads are checked against its hooks
    declarations = {}
    for node, mod, name, bound in _imports(tree, path):
        full = f"{mod}.{name}" if name else mod
        if _is_tracer_module(mod) or _is_tracer_module(full):
            found.append(f"line {node.lineno}: {'from ' + mod + ' import ' + name if name else 'import ' + mod}")
        elif name in known.get(mod, ()):
            found.append(f"line {node.lineno}: from {mod} import {name}")
        elif mod == PROTOCOL and name in DECLARATIONS:
            declarations[bound] = name
        modules[bound] = full if name else mod
    decorators = {id(d) for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                     ast.ClassDef))
                  for d in n.decorator_list}
    decorator_funcs = {id(d.func) for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                       for d in n.decorator_list if isinstance(d, ast.Call)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if node.attr == "tracer":
                found.append(f"line {node.lineno}: .tracer")
            elif isinstance(node.value, ast.Name) and node.attr in known.get(modules.get(node.value.id, ""), ()):
                found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
        elif isinstance(node, ast.Name) and node.id in declarations and id(node) not in decorator_funcs \
                and id(node) not in decorators:
            found.append(f"line {node.lineno}: {declarations[node.id]} used other than as a decorator")
        elif isinstance(node, ast.Call):
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and (
                        "jit.tracing" in arg.value or "jit.capture" in arg.value):
                    found.append(f"line {node.lineno}: {arg.value!r} by name")
    return found


@functools.lru_cache(maxsize=None)
def _hooks_of_tree() -> Tuple[Tuple[str, frozenset], ...]:
    """``_scan_hooks``, read once per session."""
    return tuple((m, frozenset(n)) for m, n in _read_hooks().items())


def _scan_hooks() -> Dict[str, Set[str]]:
    return {m: set(n) for m, n in _hooks_of_tree()}


def _read_hooks() -> Dict[str, Set[str]]:
    """module -> its names that consult the tracer, over every runtime module (to a fixed point: a hook
    re-exported is one too)."""
    trees = {p: ast.parse(p.read_text(), str(p)) for p in sorted(ROOT.rglob("*.py"))}
    known: Dict[str, Set[str]] = {}
    while True:
        new = {".".join(_module_of(p)): _hooks(t, p, known) for p, t in trees.items()}
        if new == known:
            return known
        known = new


def _scan() -> Dict[str, List[str]]:
    known = _scan_hooks()
    return {str(p.relative_to(ROOT).as_posix()): _consults(p, known=known) for p in sorted(ROOT.rglob("*.py"))}


def _outside() -> Dict[str, List[str]]:
    return {f: u for f, u in _scan().items() if u and f.split("/")[0] not in OWN}


def test_the_detector_sees_the_tracers_own_uses():
    uses = _scan()
    assert uses["jit/capture.py"] and uses["jit/function.py"]  # a check that finds nothing proves nothing
    assert any("from runtime.jit.tracing import flag" in u for u in uses["ops/primitive.py"])
    assert any("from runtime.jit.tracing import hook" in u for u in uses["ops/op_entry.py"])
    assert any("from runtime.jit.tracing import cpp_hook" in u for u in uses["_native.py"])


def test_at_most_three_files_consult_the_tracer():
    """Measured over the source tree: 10 files on 0f056ca (the five op kinds' prologues, and every
    trace break asking ``tracing()`` or calling ``trace_break()`` itself)."""
    outside = _outside()
    assert set(outside) <= ALLOWED, {f: u for f, u in outside.items() if f not in ALLOWED}
    assert len(outside) <= 3, sorted(outside)


def test_the_op_kinds_and_the_breaks_declare_themselves():
    """The protocol is used: each op kind's entry is an ``op_entry``, and the breaks are ``breaks_trace``."""
    from runtime import nn, ops
    from runtime.autograd.function import Function
    kinds = {"custom": ops.Custom.__call__, "function": Function.__dict__["apply"].__func__,
             "cell": nn.Cell.__call__}
    assert {k: getattr(f, "op_kind", None) for k, f in kinds.items()} == {k: k for k in kinds}
    declared = {f: [u for u in _imports(ast.parse((ROOT / f).read_text()), ROOT / f) if u[1] == PROTOCOL]
                for f in ("ops/tensor_methods.py", "ops/writes.py", "ops/math.py", "nn/layers.py",
                          "autograd/functional.py", "ops/custom.py", "autograd/function.py", "nn/cell.py")}
    assert all(declared.values()), [f for f, d in declared.items() if not d]


def test_tensor_does_not_import_jit():
    tree = ast.parse((ROOT / "tensor.py").read_text())
    mods: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            mods.add("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            mods.update(a.name for a in node.names)
    assert not {m for m in mods if m.lstrip(".").split(".")[0] == "jit" or m.startswith("runtime.jit")}


OLD_HOOK = {"tracing", "record_op", "trace_break"}  # 0f056ca's hook point: primitive.py's functions


@pytest.mark.parametrize("source,expected", [
    ("from ..jit.tracing import hook\n", ["line 1: from runtime.jit.tracing import hook"]),
    ("from ..jit import tracing\n", ["line 1: from runtime.jit import tracing"]),
    ("import runtime.jit.capture as t\n", ["line 1: import runtime.jit.capture"]),
    ("x = hook.tracer\n", ["line 1: .tracer"]),
    ("m = importlib.import_module('runtime.jit.tracing')\n", ["line 1: 'runtime.jit.tracing' by name"]),
    ("from ..jit import jit\nfrom ..jit.signature import exact_key\n", []),
    # 0f056ca's tensor_methods.py: a hook of another module, imported and called
    ("from .primitive import trace_break, tracing\n",
     ["line 1: from runtime.ops.primitive import trace_break", "line 1: from runtime.ops.primitive import tracing"]),
    ("from . import primitive\nif primitive.tracing():\n    pass\n", ["line 2: primitive.tracing"]),
    ("from .primitive import Primitive, defvjp\n", []),  # calling an op is entering it, not asking
    ("from .op_entry import breaks_trace\n@breaks_trace('item()')\ndef item(self): pass\n", []),
    ("from .op_entry import op_entry\nclass C:\n    @op_entry('c', lambda op: 'C')\n    def __call__(s): pass\n", []),
    ("from .op_entry import breaks_trace\ndef f():\n    breaks_trace('x')(print)()\n",
     ["line 3: breaks_trace used other than as a decorator"]),
    ("from .op_entry import _traced\n", ["line 1: from runtime.ops.op_entry import _traced"]),
])
def test_the_detector_on_examples(source, expected):
    known = _scan_hooks()
    known["runtime.ops.primitive"] = known["runtime.ops.primitive"] | OLD_HOOK
    assert sorted(_consults(ROOT / "ops" / "example.py", source, known)) == sorted(expected)


def test_the_hooks_are_found_from_the_source():
    """The hooks come from reading the modules, not a list: the protocol's private ``_traced`` is one,
    its declarations are not, and _native's re-exports of jit's names are."""
    known = _scan_hooks()
    assert "_traced" in known[PROTOCOL] and not set(DECLARATIONS) & known[PROTOCOL]
    assert {"cpp_hook", "flag_address"} <= known["runtime._native"]
    assert "Primitive" not in known["runtime.ops.primitive"]  # a class: calling it is entering an op


def test_an_op_entry_passes_every_keyword_on():
    """The entry's own parameter is positional-only: a ``construct`` keyword named ``op`` reaches it,
    eagerly and traced."""
    import numpy as np
    from runtime import Tensor, jit, nn

    class Pick(nn.Cell):
        def construct(self, x, op="keep"):
            return x * 2.0 if op == "double" else x

    x = Tensor(np.array([1.5]))
    assert Pick()(x, op="double").asnumpy().tolist() == [3.0]
    assert jit(lambda t: Pick()(t, op="double"))(x).asnumpy().tolist() == [3.0]
