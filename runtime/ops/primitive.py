"""Primitive ops: a numpy function plus a table of derivative rules.

``Primitive(name, fn)`` runs ``fn`` on the inputs' arrays; ``fn`` returns new
memory or a numpy view (an input returned unchanged as ``x.view()``), so that
a view of an input shares its version counter. ``defvjp(prim,
*rules)`` gives one rule per positional argument, ``rule(g, ans, *args,
**kwargs)`` returning that argument's gradient. Rules are written with
runtime ops, so they record a graph themselves when a higher-order gradient
is asked for (``create_graph``). The engine sums a rule's result down to the
argument's shape, so rules need not undo broadcasting.
"""
from __future__ import annotations

import dis
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import device as _device
from ..autograd.grad_mode import _state
from ..autograd.node import Node
from ..jit.tracing import hook as _trace
from ..tensor import Tensor as _Tensor
from ..versions import memory_owner as _root, share_version, version_of as _version_of

__all__ = ["Primitive", "defvjp", "PrimitiveNode"]

Rule = Optional[Callable[..., Any]]


class Primitive:
    """A named numpy function; differentiable once ``defvjp`` gives it rules."""

    __slots__ = ("name", "fn", "vjps", "reads_ans", "reads_args")

    def __init__(self, name: str, fn: Callable[..., Any]) -> None:
        self.name = name
        self.fn = fn
        self.vjps: Optional[Tuple[Rule, ...]] = None
        self.reads_ans = False  # a rule reads the op's output: its node checks the output's version
        self.reads_args: Tuple[bool, ...] = ()  # per argument: a rule reads its values (its version is checked)

    def __call__(self, *args: Any, **kwargs: Any):
        """Apply to Tensors (already converted); record a node if needed."""
        if _trace.tracer is not None:  # runtime.jit is recording this thread's ops
            return _trace.tracer.call_op("primitive", self.name, self, args, kwargs)
        try:
            if len(args) == 2:  # most ops: no list built for two arguments
                x, y = args
                out = self.fn(x._data, y._data, **kwargs)
            else:
                out = self.fn(*[a._data for a in args], **kwargs)
        except TypeError:  # numpy and CuPy arrays in one call: say so, naming both devices
            _device.check_same(args, f"op '{self.name}'")
            raise
        except ValueError as e:  # numpy's "array is too big": a result whose size in bytes overflows
            if "could not be broadcast" in str(e):
                raise ValueError(f"op '{self.name}': the shapes of its inputs "
                                 f"{[list(a.shape) for a in args]} do not broadcast together") from e
            if "too big" not in str(e):
                raise
            raise MemoryError(f"op '{self.name}': cannot allocate its result for inputs of shapes "
                              f"{[list(a.shape) for a in args]} and dtypes {', '.join(str(a.dtype) for a in args)}: "
                              f"its size in bytes overflows") from e
        if type(out) is not np.ndarray:
            out = _result(out, args, self.name)
        res = _new(_Tensor)
        res._data = out
        if out.base is not None:  # a view (reshape, slice...): maybe of an input
            _share_input_version(res, out, args)
        if _state.enabled and self.vjps is not None and out.dtype.kind in "fcV":  # integer results: no gradient (dtypes.GRAD_KINDS)
            for a in args:
                if a.requires_grad:
                    res._node = node = _record2(self, *args, kwargs, out) if len(args) == 2 \
                        else _record(self, args, kwargs, out)
                    res.requires_grad = True
                    if self.reads_ans:
                        node.out_ref = weakref.ref(res)
                    break
        return res

    def call2(self, x: Any, y: Any):
        """``self(x, y)`` for two Tensors and no keywords: the binary ops' hot path (elementwise
        and matmul functions, whose result is new memory, never a view of an input)."""
        if _trace.tracer is not None:
            return _trace.tracer.call_op("primitive", self.name, self, (x, y), {})
        try:
            out = self.fn(x._data, y._data)
        except (TypeError, ValueError):
            return self(x, y)  # the general path says what went wrong (the function is pure)
        if type(out) is not np.ndarray:
            out = _result(out, (x, y), self.name)
        res = _new(_Tensor)
        res._data = out
        if (x.requires_grad or y.requires_grad) and _state.enabled and self.vjps is not None \
                and out.dtype.kind in "fcV":  # integer results: no gradient (dtypes.GRAD_KINDS)
            res._node = node = _record2(self, x, y, {}, out)
            res.requires_grad = True
            if self.reads_ans:
                node.out_ref = weakref.ref(res)
        return res

    def __repr__(self) -> str:
        return f"<primitive {self.name}>"


def _share_input_version(res: Any, out: Any, args: Sequence[Any]) -> None:
    """``out`` views an input's memory: ``res`` counts writes on that input's version counter,
    so a write through either is seen by the version checks of nodes that saved the other."""
    root = _root(out)
    for a in args:
        if _root(a._data) is root:
            share_version(res, a)
            return


def _result(out: Any, args: Sequence[Any], name: str) -> Any:
    """A result that is not a plain ndarray: a numpy scalar made an array, or a GPU array
    (then every input must have been on its device)."""
    if _device.is_device_array(out):
        _device.check_same(args, f"op '{name}'")
        return out
    return np.asarray(out)


def defvjp(prim: Primitive, *rules: Rule) -> None:
    """Register derivative rules, one per positional argument (None: not differentiable)."""
    prim.vjps = tuple(rules)
    # each rule disassembled once (dis is most of what defining the built-in ops costs at import)
    ins = {id(r): _instructions(r) for r in rules if r is not None}
    prim.reads_ans = any(_reads_ans(ins[id(r)]) for r in rules if r is not None)
    prim.reads_args = tuple(any(_reads_values(r, ins[id(r)], i) for r in rules if r is not None)
                            for i in range(len(rules)))


def _instructions(rule: Callable[..., Any]) -> Optional[List[dis.Instruction]]:
    """``rule``'s bytecode instructions; None when it is not plain Python code."""
    code = getattr(rule, "__code__", None)
    return None if code is None else list(dis.get_instructions(code))


def _reads_ans(ins: Optional[List[dis.Instruction]]) -> bool:
    """Whether a rule (its instructions) reads its ``ans`` argument (not plain Python code: assume so)."""
    if ins is None:
        return True
    return any(i.argval == "ans" and i.opname.startswith("LOAD_") for i in ins)


_META = frozenset({"shape", "dtype", "ndim", "size", "device"})  # what an in-place write never changes


def _reads_values(rule: Callable[..., Any], ins: Optional[List[dis.Instruction]], position: int) -> bool:
    """Whether ``rule`` reads the values of argument ``position`` (``rule(g, ans, *args)``), not only
    its shape or dtype (``x.shape``, ``x._data.dtype``): a write into an argument the rules read
    no value of (transpose's, add's) cannot change the gradient, so its version is not checked.
    Anything this cannot see through (not plain Python, ``*args``, a closure) counts as a read."""
    code = getattr(rule, "__code__", None)
    if code is None or 2 + position >= code.co_argcount:
        return True
    name = code.co_varnames[2 + position]
    if ins is None:
        return True
    for k, i in enumerate(ins):
        if i.argval != name or not i.opname.startswith(("LOAD_", "MAKE_CELL")):
            continue
        a = ins[k + 1] if k + 1 < len(ins) else None
        b = ins[k + 2] if k + 2 < len(ins) else None
        if a is not None and a.opname == "LOAD_ATTR" and (
                a.argval in _META or (a.argval == "_data" and b is not None and b.opname == "LOAD_ATTR"
                                      and b.argval in _META)):
            continue
        return True
    return False


class PrimitiveNode(Node):
    """A recorded primitive call. Its ``input_meta`` is built when first asked (recording builds
    no tuples for it), from the saved arguments (a backward first checks that their versions
    are unchanged), and kept when ``release`` frees them."""

    __slots__ = ("prim", "args", "kwargs", "versions", "out", "out_ref", "_input_meta")

    def __init__(self, prim: Primitive, args: Sequence[Any], kwargs: Dict[str, Any], out: np.ndarray) -> None:
        _record(prim, args, kwargs, out, self)

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.prim.name

    @property
    def input_meta(self):  # type: ignore[override]
        m = self._input_meta
        if m is None:
            m = self._input_meta = tuple([(a._data.shape, a._data.dtype) for a in self.args])
        return m

    def apply(self, grads, create_graph):
        args = self.args
        if args is None:
            raise RuntimeError(f"backward through {self.name} a second time: its saved tensors were "
                               f"freed after the first backward; pass retain_graph=True the first time")
        if len(args) == 2:
            x, y = args
            if (x._vc.value, y._vc.value) != self.versions:
                self._stale()
        elif tuple(map(_version_of, args)) != self.versions:
            self._stale()
        ref = self.out_ref
        if ref is not None:  # a rule reads the output: it must be as the op made it (a new tensor: version 0)
            t = ref()
            if t is not None and t._version:
                raise RuntimeError(f"one of the tensors needed for gradient computation has been modified by an "
                                   f"in-place operation: output 0 of {self.name} is at version {t._version}; "
                                   f"expected version 0")
        ans = _new(_Tensor)
        ans._data = self.out
        if create_graph:
            ans._node = self
            ans.requires_grad = True
        g = grads[0]
        kw = self.kwargs
        vjps = self.prim.vjps
        edges = self.next_edges
        if len(edges) == 2 and len(vjps) == 2 and not kw:  # a binary op: no comprehension, no **{}
            r0, r1 = vjps
            e0, e1 = edges
            return [None if (e0 is None or r0 is None) else r0(g, ans, x, y),
                    None if (e1 is None or r1 is None) else r1(g, ans, x, y)]
        return [None if (e is None or rule is None) else rule(g, ans, *args, **kw)
                for rule, e in zip(vjps, edges)]

    def _stale(self) -> None:
        """Raise for the first changed argument whose values a rule reads (shape-only ones may change)."""
        reads = self.prim.reads_args
        for i, (a, v) in enumerate(zip(self.args, self.versions)):
            if a._version != v and (i >= len(reads) or reads[i]):
                raise RuntimeError(f"one of the tensors needed for gradient computation has been modified "
                                   f"by an in-place operation: argument {i} of {self.name} is at version "
                                   f"{a._version}; expected version {v}")

    def release(self) -> None:
        if self._input_meta is None and self.args is not None:
            self.input_meta  # noqa: B018 (kept: the engine checks gradients against it after release)
        self.args = None
        self.out = None


_new = object.__new__


def _record(prim: Primitive, args: Sequence[Any], kwargs: Dict[str, Any], out: np.ndarray,
            node: Optional[PrimitiveNode] = None) -> PrimitiveNode:
    """A node (or ``node``) with its fields set in one pass over ``args`` (the recording hot path)."""
    if node is None:
        node = _new(PrimitiveNode)
    node.prim = prim
    node.args = args
    node.kwargs = kwargs
    node.out = out
    node.out_ref = None
    node._input_meta = None
    node.versions = tuple(map(_version_of, args))
    node.next_edges = tuple([(a if a._node is None else (a._node, a._out_index)) if a.requires_grad else None
                             for a in args])
    node.out_meta = ((out.shape, out.dtype),)
    return node


def _record2(prim: Primitive, x: Any, y: Any, kwargs: Dict[str, Any], out: np.ndarray) -> PrimitiveNode:
    """``_record`` for two arguments, unrolled (every recorded binary op comes here)."""
    node = _new(PrimitiveNode)
    node.prim = prim
    node.args = (x, y)
    node.kwargs = kwargs
    node.out = out
    node.out_ref = None
    node._input_meta = None
    node.versions = (x._vc.value, y._vc.value)  # _version without its property's call
    node.next_edges = ((x if x._node is None else (x._node, x._out_index)) if x.requires_grad else None,
                       (y if y._node is None else (y._node, y._out_index)) if y.requires_grad else None)
    node.out_meta = ((out.shape, out.dtype),)
    return node

