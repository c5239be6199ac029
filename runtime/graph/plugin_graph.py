"""A ``Graph`` as the plain C structs a backend plugin reads (plugin_abi.py).

``CGraph(graph)`` encodes the graph once: nodes with their op names, kinds,
inputs, attributes and output shapes/dtypes, the constants, the outputs. It
owns every buffer the structs point into, so the plugin's view stays valid
for as long as the ``CGraph`` lives (the runtime keeps it with the built graph).
"""
from __future__ import annotations

import ctypes as C
import itertools
import numbers
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from . import plugin_abi as abi
from .graph import Const, Graph, Input, Ref

__all__ = ["CGraph", "dtype_name"]

_handles = itertools.count(1)


def dtype_name(dtype: Any) -> bytes:
    """numpy's name of a dtype, as the ABI spells dtypes (``b"float32"``)."""
    return np.dtype(dtype).name.encode()


class CGraph:
    """The C view of ``graph`` (``.rec``), with the buffers it points into and its constants."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.handle = next(_handles)
        self._keep: List[Any] = []
        self.consts: List[Const] = []
        self._const_index: Dict[int, int] = {}
        nodes = (abi.NodeRec * max(len(graph.nodes), 1))()
        for k, n in enumerate(graph.nodes):
            ins = self._refs(n.inputs)
            attrs = (abi.Attr * max(len(n.attrs), 1))()
            for j, (name, value) in enumerate(n.attrs.items()):
                attrs[j] = self._attr(name, value)
            outs = self._metas(n.out_shapes, n.out_dtypes)
            nodes[k] = abi.NodeRec(k, self._b(n.op), self._b(n.kind), len(n.inputs), ins, len(n.attrs), attrs,
                                   len(n.out_shapes), outs)
        self._keep.append(nodes)
        outputs = self._refs(graph.outputs)
        consts = (abi.ConstRec * max(len(self.consts), 1))()
        for k, c in enumerate(self.consts):
            consts[k] = self._const(c.value)
        self._keep.append(consts)
        self.rec = abi.GraphRec(self._b(graph.name), self.handle, len(graph.input_shapes),
                                self._metas(graph.input_shapes, graph.input_dtypes), len(self.consts), consts,
                                len(graph.nodes), nodes, len(graph.outputs), outputs)

    def _b(self, text: str) -> bytes:
        b = str(text).encode()
        self._keep.append(b)
        return b

    def _ints(self, values: Sequence[int]) -> Any:
        arr = (C.c_int64 * max(len(values), 1))(*values)
        self._keep.append(arr)
        return arr

    def _metas(self, shapes: Sequence[Tuple[int, ...]], dtypes: Sequence[Any]) -> Any:
        arr = (abi.Tensor * max(len(shapes), 1))()
        for k, (s, d) in enumerate(zip(shapes, dtypes)):
            arr[k] = abi.Tensor(None, self._b(np.dtype(d).name), len(s), self._ints(s), -1)
        self._keep.append(arr)
        return arr

    def _refs(self, refs: Sequence[Ref]) -> Any:
        arr = (abi.Ref * max(len(refs), 1))()
        for k, r in enumerate(refs):
            if isinstance(r, Input):
                arr[k] = abi.Ref(abi.REF_INPUT, r.index, 0)
            elif isinstance(r, Const):
                i = self._const_index.setdefault(id(r.value), len(self.consts))
                if i == len(self.consts):
                    self.consts.append(r)
                arr[k] = abi.Ref(abi.REF_CONST, i, 0)
            else:
                arr[k] = abi.Ref(abi.REF_OUTPUT, r.index, r.node)
        self._keep.append(arr)
        return arr

    def _const(self, v: Any) -> abi.ConstRec:
        if hasattr(v, "_data"):
            a = v._data
            return abi.ConstRec(abi.CONST_TENSOR, 0.0, abi.Tensor(None, self._b(a.dtype.name), a.ndim,
                                                                  self._ints(a.shape), -1), self._b("tensor"))
        empty = abi.Tensor(None, self._b(""), 0, None, -1)
        if isinstance(v, numbers.Real) and not isinstance(v, bool):
            return abi.ConstRec(abi.CONST_NUMBER, float(v), empty, self._b(repr(v)))
        return abi.ConstRec(abi.CONST_OTHER, 0.0, empty, self._b(repr(v)))

    def _attr(self, name: str, v: Any) -> abi.Attr:
        text = self._b(repr(v))
        a = abi.Attr(self._b(name), abi.ATTR["other"], 0, 0, 0.0, None, None, text)
        if v is None:
            a.kind = abi.ATTR["none"]
        elif isinstance(v, (bool, np.bool_)):
            a.kind, a.i, a.count = abi.ATTR["bool"], int(v), 1
        elif isinstance(v, numbers.Integral):
            a.kind, a.i, a.count = abi.ATTR["int"], int(v), 1
        elif isinstance(v, numbers.Real):
            a.kind, a.f, a.count = abi.ATTR["float"], float(v), 1
        elif isinstance(v, str):
            a.kind, a.count = abi.ATTR["str"], 1
            a.text = self._b(v)
        elif isinstance(v, (tuple, list)) and all(isinstance(x, numbers.Integral) and not isinstance(x, bool)
                                                  for x in v):
            a.kind, a.count, a.ints = abi.ATTR["ints"], len(v), self._ints([int(x) for x in v])
        elif isinstance(v, (tuple, list)) and all(isinstance(x, numbers.Real) for x in v):
            arr = (C.c_double * max(len(v), 1))(*[float(x) for x in v])
            self._keep.append(arr)
            a.kind, a.count, a.floats = abi.ATTR["floats"], len(v), arr
        return a


def config_struct(config: Dict[str, Any], keep: List[Any]) -> abi.Config:
    """``jit``'s config (jit_level and options) as an ``ob_config``; buffers appended to ``keep``."""
    opts = [(k, v) for k, v in config.items() if k != "jit_level"]
    arr = (abi.Option * max(len(opts), 1))()
    for k, (key, v) in enumerate(opts):
        kb, vb = str(key).encode(), (v if isinstance(v, str) else repr(v)).encode()
        keep.extend([kb, vb])
        arr[k] = abi.Option(kb, vb)
    level = str(config.get("jit_level", "O0")).encode()
    keep.extend([arr, level])
    return abi.Config(level, len(opts), arr)
