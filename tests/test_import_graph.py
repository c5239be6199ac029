"""No import circles among the modules of ``runtime`` and ``opbuilder`` (issue 22).

The graph counts every import statement of a module, inside functions and under ``TYPE_CHECKING``
too: a lazy import is fine when it points the same way as the rest. A package ``__init__`` is the
package's facade: its top-level imports count, the lazy re-exports in its functions (PEP 562
``__getattr__``, ``opbuilder.to_torch``) do not, nor do the parent packages Python imports first
(tests/import_graph.py says why). So a module may import a sibling through the package
(``from .. import ops``) as long as the package's eager imports do not lead back to it.
"""
from __future__ import annotations

from pathlib import Path

from import_graph import a_cycle, import_graph, strongly_connected

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("runtime", "opbuilder")


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
