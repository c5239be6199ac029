"""Where the runtime consults jit's tracer (issue 22, item 2): one hook point.

Outside ``runtime/jit/`` and ``runtime/graph/`` only the op layer's hook
(``runtime/ops/primitive.py``: ``Primitive.call``, ``tracing``, ``record_op``,
``trace_break``) may import jit's tracing modules or read a ``.tracer``; every
other module goes through those functions. Read from the source with ``ast``,
so a new direct use anywhere fails here.
"""
import ast
from pathlib import Path
from typing import List, Optional, Set

import pytest

import runtime

ROOT = Path(runtime.__file__).parent
TRACER_MODULES = ("runtime.jit.tracing", "runtime.jit.capture")  # capture.py: the Tracer class
OWN = ("jit", "graph")  # the tracer's own packages
ALLOWED = {"ops/primitive.py", "_native.py"}  # the hook point, and what the C++ op entry reads (cpp_hook, flag)


def _module_of(path: Path) -> List[str]:
    parts = ["runtime", *path.relative_to(ROOT).with_suffix("").parts]
    return parts[:-1] if parts[-1] == "__init__" else parts


def _is_tracer_module(name: str) -> bool:
    return any(name == m or name.startswith(m + ".") for m in TRACER_MODULES)


def _consults(path: Path, source: Optional[str] = None) -> List[str]:
    """How ``path`` (or ``source`` placed there) reaches the tracer: imports of its modules, ``.tracer``
    reads, import-by-name calls."""
    tree = ast.parse(path.read_text() if source is None else source, str(path))
    package = _module_of(path)
    if path.name != "__init__.py":
        package = package[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            mod = ".".join(base + (node.module.split(".") if node.module else []))
            names = [f"{mod}.{a.name}" for a in node.names]
            if _is_tracer_module(mod) or any(_is_tracer_module(n) for n in names):
                found.append(f"line {node.lineno}: from {mod} import ...")
        elif isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names if _is_tracer_module(a.name)]
        elif isinstance(node, ast.Attribute) and node.attr == "tracer":
            found.append(f"line {node.lineno}: .tracer")
        elif isinstance(node, ast.Call):
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and (
                        "jit.tracing" in arg.value or "jit.capture" in arg.value):
                    found.append(f"line {node.lineno}: {arg.value!r} by name")
    return found


def _scan() -> dict:
    return {str(p.relative_to(ROOT).as_posix()): _consults(p) for p in sorted(ROOT.rglob("*.py"))}


def test_the_detector_sees_the_tracers_own_uses():
    uses = _scan()
    assert uses["jit/capture.py"] and uses["jit/function.py"]  # a check that finds nothing proves nothing
    assert any("from runtime.jit.tracing import" in u for u in uses["ops/primitive.py"])


def test_only_the_hook_point_consults_the_tracer():
    outside = {f: u for f, u in _scan().items() if u and f.split("/")[0] not in OWN}
    assert set(outside) <= ALLOWED, {f: u for f, u in outside.items() if f not in ALLOWED}
    assert len(ALLOWED) <= 3


def test_tensor_does_not_import_jit():
    tree = ast.parse((ROOT / "tensor.py").read_text())
    mods: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            mods.add("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            mods.update(a.name for a in node.names)
    assert not {m for m in mods if m.lstrip(".").split(".")[0] == "jit" or m.startswith("runtime.jit")}


@pytest.mark.parametrize("source,expected", [
    ("from ..jit.tracing import hook\n", ["line 1: from runtime.jit.tracing import ..."]),
    ("from ..jit import tracing\n", ["line 1: from runtime.jit import ..."]),
    ("import runtime.jit.capture as t\n", ["line 1: import runtime.jit.capture"]),
    ("x = hook.tracer\n", ["line 1: .tracer"]),
    ("m = importlib.import_module('runtime.jit.tracing')\n", ["line 1: 'runtime.jit.tracing' by name"]),
    ("from ..jit import jit\nfrom ..jit.signature import exact_key\n", []),
])
def test_the_detector_on_examples(source, expected):
    assert _consults(ROOT / "ops" / "example.py", source) == expected
