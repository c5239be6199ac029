"""The import graph of ``runtime`` and ``opbuilder``: no circles (issue 22), and layers that point one way
(issue 34).

The graph counts every import statement of a module, inside functions and under ``TYPE_CHECKING``
too: a lazy import is fine when it points the same way as the rest. A package ``__init__`` is the
package's facade: its top-level imports count, the lazy re-exports in its functions (PEP 562
``__getattr__``) do not, nor do the parent packages Python imports first (tests/import_graph.py says
why). So a module may import a sibling through the package (``from .. import ops``) as long as the
package's eager imports do not lead back to it.

Layers, bottom up (DESIGN.md): the builder (``opbuilder``, but for the two below) <- the runtime
(``runtime``) <- the bridges (``opbuilder.bridges``: torch, JAX) <- the command line (``opbuilder.cli``,
``opbuilder.demo``, ``opbuilder.__main__``). A module imports its own layer and the layers below it,
never one above, wherever the import stands; the one way up is ``opbuilder``'s PEP 562 ``__getattr__``,
which hands out ``opbuilder.to_torch`` and ``opbuilder.to_jax`` when they are asked for.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

from import_graph import Graph, a_cycle, import_graph, strongly_connected

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("runtime", "opbuilder")
LAYERS = ("builder", "runtime", "bridges", "command line")  # bottom up
COMMAND_LINE = ("opbuilder.cli", "opbuilder.demo", "opbuilder.__main__")
BRIDGES = "opbuilder.bridges"
# the bridges' modules at their paths before opbuilder/ was grouped: aliases of the moved ones, in their layer
MOVED_BRIDGES = ("opbuilder.interop_torch", "opbuilder.interop_jax", "opbuilder.torch_bridge")
LAZY_REEXPORT = ("__getattr__",)  # the only functions of a package __init__ whose imports may point up


def layer_of(module: str) -> str:
    """The layer ``module`` belongs to (a package is its ``__init__``)."""
    if module in COMMAND_LINE or module.startswith(tuple(m + "." for m in COMMAND_LINE)):
        return "command line"
    if module == BRIDGES or module.startswith(BRIDGES + ".") or module in MOVED_BRIDGES:
        return "bridges"
    if module == "runtime" or module.startswith("runtime."):
        return "runtime"
    assert module == "opbuilder" or module.startswith("opbuilder."), module
    return "builder"


def upward_imports(graph: Graph) -> List[Tuple[str, str, int]]:
    """Every import (module, imported module, line) that points to a higher layer."""
    return sorted((a, b, line) for a, edges in graph.items() for b, line in edges.items()
                  if LAYERS.index(layer_of(b)) > LAYERS.index(layer_of(a)))


def layer_graph(graph: Graph) -> Dict[str, Dict[str, str]]:
    """The graph between layers: layer -> {layer it imports: one import that does it, as ``a -> b``}."""
    out: Dict[str, Dict[str, str]] = {layer: {} for layer in LAYERS}
    for a, edges in sorted(graph.items()):
        for b in sorted(edges):
            if layer_of(a) != layer_of(b):
                out[layer_of(a)].setdefault(layer_of(b), f"{a} -> {b}")
    return out


def test_no_import_circle():
    graph = import_graph(ROOT, PACKAGES)
    circles = [c for c in strongly_connected(graph) if len(c) > 1]
    report = "\n".join(f"circle of {len(c)}: {', '.join(c)}\n  " + "\n  ".join(a_cycle(graph, c))
                       for c in circles)
    assert not circles, f"{len(circles)} import circle(s):\n{report}"


def test_the_graph_sees_every_kind_of_import():
    """The parser finds the edges the circle check relies on (else it would pass on an empty graph)."""
    graph = import_graph(ROOT, PACKAGES)
    assert {"runtime.tensor", "runtime.ops.math", "runtime.autograd.engine", "runtime.hybrid.kernel",
            "opbuilder.cache.lock", "opbuilder.diagnose.doctor"} <= set(graph)
    assert "runtime.tensor" in graph["runtime.ops.math"]  # from ..tensor import Tensor (top level)
    assert "runtime.ops.math" in graph["runtime.autograd.engine"]  # from ..ops import math (in a function)
    assert "opbuilder.cache.lock" in graph["opbuilder.builder"]  # from .lock import build_lock (in a function)
    assert "runtime.tensor" in graph["runtime"]  # a package __init__'s top-level import counts
    assert "runtime.hybrid" not in graph["runtime.ops"]  # ... its lazy __getattr__ re-export does not


def test_a_circle_is_found_and_printed(tmp_path):
    """A circle through a function-level import, a `from pkg import submodule` and a TYPE_CHECKING block."""
    pkg = tmp_path / "p"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import x\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import p.a\nx = 1\n")
    (pkg / "d.py").write_text("from . import a\n")
    graph = import_graph(tmp_path, ["p"])
    circles = [c for c in strongly_connected(graph) if len(c) > 1]
    assert circles == [["p.a", "p.c", "p.sub.b"]]
    assert a_cycle(graph, circles[0]) == ["p.a (line 1) -> p.sub.b", "p.sub.b (line 2) -> p.c",
                                          "p.c (line 3) -> p.a"]


def test_layers_point_down():
    """No arrow from the builder to ``runtime`` or the bridges, nor from the runtime to the bridges: not at
    the top of a module, not inside a function. Fails on 0f056ca: opbuilder.interop_torch (then in the
    builder) imported runtime, and runtime.ops imports opbuilder, so the two packages imported each other."""
    graph = import_graph(ROOT, PACKAGES, facade_functions=LAZY_REEXPORT)
    up = upward_imports(graph)
    report = "\n".join(f"  {a} ({layer_of(a)}, line {line}) -> {b} ({layer_of(b)})" for a, b, line in up)
    assert not up, f"{len(up)} import(s) point up the layers {' <- '.join(LAYERS)}:\n{report}"


def test_the_packages_import_each_other_one_way():
    """The package-level graph: each layer imports only layers below it, and each layer is there (a rule
    that no module falls under would pass on nothing)."""
    layers = layer_graph(import_graph(ROOT, PACKAGES, facade_functions=LAZY_REEXPORT))
    assert layers["builder"] == {}, layers["builder"]
    assert set(layers["runtime"]) == {"builder"}, layers["runtime"]
    assert set(layers["bridges"]) == {"builder", "runtime"}, layers["bridges"]
    assert set(layers["command line"]) <= {"builder", "runtime", "bridges"}
    assert "runtime" in layers["command line"]  # the demo runs the design's example on the runtime


def test_the_layer_check_sees_a_function_level_import_and_skips_only_getattr(tmp_path):
    """In a package ``__init__``, an import in ``__getattr__`` is a lazy re-export; one in any other function
    counts. A builder module's function-level import of the runtime is found."""
    (tmp_path / "opbuilder" / "bridges").mkdir(parents=True)
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "__init__.py").write_text("from opbuilder import spec\n")
    (tmp_path / "opbuilder" / "bridges" / "__init__.py").write_text("")
    (tmp_path / "opbuilder" / "bridges" / "torch.py").write_text("import runtime\n")
    (tmp_path / "opbuilder" / "spec.py").write_text("def f():\n    import runtime\n")
    (tmp_path / "opbuilder" / "__init__.py").write_text(
        "def __getattr__(name):\n    from .bridges import torch\n"
        "def to_jax():\n    from .bridges.torch import x\n")
    graph = import_graph(tmp_path, PACKAGES, facade_functions=LAZY_REEXPORT)
    assert upward_imports(graph) == [("opbuilder", "opbuilder.bridges.torch", 4), ("opbuilder.spec", "runtime", 2)]
    assert upward_imports(import_graph(tmp_path, PACKAGES)) == [("opbuilder.spec", "runtime", 2)]


def _fresh_python(code: str) -> list:
    """The lines ``code`` prints in a new interpreter that imports this checkout's opbuilder."""
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_importing_the_builder_runs_no_module_of_a_higher_layer():
    """What the graph says, in a fresh interpreter: ``import opbuilder`` imports neither the runtime nor a
    bridge, nor torch or jax; ``from opbuilder import *`` adds only ``Spec``'s module (the bridges' shape
    records, which import nothing above the builder). ``opbuilder.to_torch`` and ``to_jax`` are the
    bridges' own functions, handed out when asked for."""
    code = ("import sys\n"
            "def above():\n"
            "    return sorted(m for m in sys.modules if m.split('.')[0] in ('runtime', 'torch', 'jax')\n"
            "                  or m.startswith('opbuilder.bridges'))\n"
            "import opbuilder\nprint(above())\n"
            "from opbuilder import *\nprint(above())\n"
            "from opbuilder.bridges import interop_jax, interop_torch\n"
            "assert opbuilder.to_torch is interop_torch.to_torch and opbuilder.to_jax is interop_jax.to_jax\n"
            "assert {'to_torch', 'to_jax', 'Spec', 'load_inline'} <= set(dir(opbuilder))\n")
    assert _fresh_python(code) == ["[]", "['opbuilder.bridges', 'opbuilder.bridges.interop_common']"]


def test_reloading_opbuilder_keeps_its_builder_class_and_load_has_resolvable_hints():
    """``CustomOpBuilder`` is defined in the package (0163d0a): ``importlib.reload(opbuilder)`` made a new
    class, so builders made before, and many.py's check of load_many's items, no longer matched it; and
    ``load``'s return hint named a type imported only for type checkers (both fail on f2d235d)."""
    code = ("import importlib, typing, opbuilder\n"
            "from opbuilder import many\n"
            "first = opbuilder.CustomOpBuilder\n"
            "importlib.reload(opbuilder)\n"
            "print(opbuilder.CustomOpBuilder is first, many.CustomOpBuilder is opbuilder.CustomOpBuilder)\n"
            "print(typing.get_type_hints(opbuilder.CustomOpBuilder.load))\n")
    assert _fresh_python(code) == ["True True", "{'return': <class 'module'>}"]
