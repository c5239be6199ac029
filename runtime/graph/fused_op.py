"""A fused group as an operator: its generated kernel, built and called as an aot ``ops.Custom``.

The source (kernel_source.py) is written once under the builder's cache
(``<cache>/jit_kernels/<symbol>.cpp``, named by a hash of its text) and built
by ``ops.Custom``'s own path (``opbuilder.build_library``, cached by content),
so a process with a warm cache runs no compiler. The gradient re-runs the
group's nodes with the runtime's ops and differentiates them, so it is exact
and differentiable again.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

from ..autograd.engine import grad as _autograd_grad
from ..autograd.grad_mode import enable_grad, is_grad_enabled
from ..ops.custom import Custom
from ..tensor import Tensor
from .graph import Graph
from .. import vector_math
from .kernel_source import kernel_source

__all__ = ["fused_target", "kernel_dir", "CFLAGS"]

CFLAGS = ["-O3", "-Wall", "-Wextra"] + vector_math.cflags()  # no errno, omp simd, this CPU's vector width

_SIMD = vector_math.available()
_FLAGS = CFLAGS
_LDFLAGS = vector_math.ldflags()
_ops: Dict[str, Custom] = {}  # symbol -> op, per process


def kernel_dir() -> Path:
    """Where generated kernel sources live: ``jit_kernels`` in the builder's cache."""
    from opbuilder.cache.cache_dir import cache_root
    from opbuilder.cache.trust import trusted_root
    return trusted_root(cache_root() / "jit_kernels")


def _write_once(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` unless it holds it already (atomic: a temp file, then rename)."""
    try:
        if path.read_text() == text:
            return
    except OSError:
        pass
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _bprop(sub: Graph) -> Callable[..., Tuple[Any, ...]]:
    nin = len(sub.input_shapes)

    def bprop(*args: Any) -> Tuple[Any, ...]:
        inputs, dout = args[:nin], args[-1]
        douts = list(dout) if isinstance(dout, tuple) else [dout]
        create = is_grad_enabled()  # on when a higher-order gradient is asked for
        want = [i for i, x in enumerate(inputs) if isinstance(x, Tensor) and x.requires_grad]
        with enable_grad():
            xs = list(inputs)
            if not create:  # differentiate a private copy of the group, not the caller's graph
                for i in want:
                    xs[i] = Tensor._from_array(inputs[i]._data)
                    xs[i].requires_grad = True
            outs = sub.run(xs)
            pairs = [(o, g) for o, g in zip(outs, douts) if isinstance(o, Tensor) and o.requires_grad]
            gs = _autograd_grad([o for o, _ in pairs], [xs[i] for i in want], grad_outputs=[g for _, g in pairs],
                                create_graph=create, allow_unused=True) if pairs and want else []
        res: List[Any] = [None] * nin
        for i, g in zip(want, gs):
            res[i] = g
        return tuple(res)

    return bprop


def fused_target(sub: Graph) -> Callable[..., Any]:
    """The operator running ``sub``'s nodes as one generated kernel (built now if the cache lacks it)."""
    symbol, text = kernel_source(sub, _SIMD)
    shapes = [sub.nodes[r.node].out_shapes[r.index] for r in sub.outputs]  # type: ignore[union-attr]
    key = symbol + repr(shapes)
    op = _ops.get(key)
    if op is None:
        path = kernel_dir() / f"{symbol}.cpp"
        _write_once(path, text)
        dtype = sub.nodes[0].out_dtypes[0]
        nout = len(sub.outputs)
        op = Custom(f"{path}:{symbol}", out_shape=shapes if nout > 1 else shapes[0],
                    out_dtype=[dtype] * nout if nout > 1 else dtype, func_type="aot", bprop=_bprop(sub),
                    cflags=_FLAGS, ldflags=_LDFLAGS)
        _ops[key] = op
    return op
