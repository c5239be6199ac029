"""Output shapes and dtypes from the ``output_tensor`` declarations, without running the loops.

The top-level statements before each declaration are evaluated on the input
shapes: scalar assignments whose values are sizes (``n = x.shape[0] * 2``)
are computed, anything else marks its name as unknown. A declared shape or
dtype that needs an unknown value (a tensor element, a loop result) is a
HybridTypeError saying to pass ``out_shape``; a negative size is the
ValueError the declaration raises when it runs, in both targets.
"""
from __future__ import annotations

import ast
import operator
from typing import Any, Dict, List, Sequence, Tuple

from .dsl import INTRINSICS, dtype_name
from .errors import HybridTypeError, negative_size_message
from .source import ParsedKernel
from .validate import KernelInfo

__all__ = ["declared_specs", "static_dtype"]

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
        ast.Mod: operator.mod}


class _Unknown(Exception):
    def __init__(self, node: ast.AST, why: str) -> None:
        super().__init__(why)
        self.node = node


class _Negative(Exception):
    """A declared size is negative: numpy's ValueError when the declaration runs, in both targets."""


def static_dtype(node: ast.expr, tensor_dtypes: Dict[str, str]) -> str:
    """The dtype an output_tensor/allocate dtype argument names."""
    if isinstance(node, ast.Constant):
        name = dtype_name(node.value)
    elif isinstance(node, ast.Attribute):
        assert isinstance(node.value, ast.Name)
        name = tensor_dtypes.get(node.value.id)
    else:
        assert isinstance(node, ast.Name)
        name = dtype_name(INTRINSICS[node.id])
    if name is None:
        raise _Unknown(node, f"{ast.unparse(node)} is not a dtype this runtime has")
    return name


class _ShapeEval:
    def __init__(self, parsed: ParsedKernel, info: KernelInfo, shapes: Dict[str, Tuple[int, ...]]) -> None:
        self.parsed = parsed
        self.info = info
        self.shapes = dict(shapes)
        self.values: Dict[str, Any] = dict(info.constants)
        self.unknown: Dict[str, str] = {}

    def shape(self, node: ast.expr) -> Tuple[int, ...]:
        if isinstance(node, ast.Attribute):
            assert isinstance(node.value, ast.Name)
            return self._shape_of(node.value)
        assert isinstance(node, (ast.Tuple, ast.List))
        dims = []
        for e in node.elts:
            v = self.value(e)
            if isinstance(v, bool) or not isinstance(v, int):
                raise _Unknown(e, f"the size {ast.unparse(e)} is not an int")
            if v < 0:
                raise _Negative()
            dims.append(v)
        return tuple(dims)

    def _shape_of(self, name: ast.Name) -> Tuple[int, ...]:
        if name.id not in self.shapes:  # a temporary sized at run time
            raise _Unknown(name, f"the shape of '{name.id}' is not computed from the input shapes alone")
        return self.shapes[name.id]

    def value(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in self.values:
                return self.values[node.id]
            raise _Unknown(node, self.unknown.get(node.id, f"'{node.id}' is not known before the loops run"))
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute):
            assert isinstance(node.value.value, ast.Name)
            shape = self._shape_of(node.value.value)
            k = self.value(node.slice)
            if not -len(shape) <= k < len(shape):
                raise _Unknown(node, f"{ast.unparse(node)}: the tensor has rank {len(shape)}")
            return shape[k]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](self.value(node.left), self.value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -self.value(node.operand)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("max", "min", "int"):
            args = [self.value(a) for a in node.args]
            return {"max": max, "min": min, "int": int}[node.func.id](*args)
        raise _Unknown(node, f"{ast.unparse(node)} is not computed from the input shapes alone")

    def top_level(self, stmts: Sequence[ast.stmt], dtypes: Dict[str, str]) -> Dict[str, Tuple[Tuple[int, ...], str]]:
        out: Dict[str, Tuple[Tuple[int, ...], str]] = {}
        for s in stmts:
            if isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Name):
                name = s.targets[0].id
                if name in self.info.decls:
                    call = self.info.decls[name]
                    dtypes[name] = static_dtype(call.args[1], dtypes)
                    try:
                        shape = self.shape(call.args[0])
                    except _Negative:
                        assert isinstance(call.func, ast.Name)
                        raise ValueError(negative_size_message(self.parsed.where(call), call.lineno, call.func.id,
                                                               getattr(call, "ob_kernel", self.parsed.name))) from None
                    except _Unknown:
                        if name in self.info.temporaries:  # sized at run time; no output depends on it
                            continue
                        raise
                    self.shapes[name] = shape
                    out[name] = (shape, dtypes[name])
                    continue
                try:
                    self.values[name] = self.value(s.value)
                    self.unknown.pop(name, None)
                except _Unknown as e:
                    self.values.pop(name, None)
                    self.unknown[name] = f"'{name}' (line {s.lineno}) is not computed from the input shapes " \
                                         f"alone ({e})"
            else:  # a loop or branch may assign anything it contains
                for n in ast.walk(s):
                    if isinstance(n, (ast.Assign, ast.AugAssign)):
                        for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                            if isinstance(t, ast.Name):
                                self.values.pop(t.id, None)
                                self.unknown[t.id] = f"'{t.id}' is assigned inside a loop or branch (line " \
                                                     f"{n.lineno})"
        return out


def declared_specs(parsed: ParsedKernel, info: KernelInfo, shapes: Sequence[Sequence[int]],
                   dtypes: Sequence[str]) -> List[Tuple[Tuple[int, ...], str]]:
    """(shape, dtype name) of each output, in return order, for inputs of these shapes and dtypes."""
    if len(shapes) != len(info.inputs):
        raise TypeError(f"hybrid kernel '{parsed.name}' takes {len(info.inputs)} inputs "
                        f"({', '.join(info.inputs)}), got {len(shapes)}")
    ev = _ShapeEval(parsed, info, {n: tuple(int(d) for d in s) for n, s in zip(info.inputs, shapes)})
    known = dict(zip(info.inputs, dtypes))
    try:
        decl = ev.top_level(parsed.tree.body, known)
    except _Unknown as e:
        raise parsed.error(e.node, f"the output shapes cannot be inferred: {e}; pass out_shape to ops.Custom",
                           HybridTypeError) from None
    return [decl[n] for n in info.outputs]
