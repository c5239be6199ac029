"""Primitive ops: a numpy function plus a table of derivative rules.

``Primitive(name, fn)`` runs ``fn`` on the inputs' arrays; ``fn`` returns new
memory or a numpy view (an input returned unchanged as ``x.view()``), so that
a view of an input shares its version counter. ``defvjp(prim, *rules,
reads_output=..., reads_inputs=...)`` gives one rule per positional argument,
``rule(g, ans, *args, **kwargs)`` returning that argument's gradient, and
declares what the rules read: the output ``ans``, and which arguments' values
(not only their shape or dtype). Undeclared, everything counts as read (the
safe choice: every saved value is checked by version at backward). Rules are
written with runtime ops, so they record a graph themselves when a
higher-order gradient is asked for (``create_graph``). The engine sums a
rule's result down to the argument's shape, so rules need not undo
broadcasting.
"""
from __future__ import annotations

import weakref
from types import MappingProxyType
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from .. import device as _device
from ..autograd.grad_mode import _state, hooks_open as _hooks_open
from ..autograd.saved_hooks import unpacked as _unpacked
from ..autograd.node import Node
from ..jit.tracing import flag as _flag
from ..jit.tracing import hook as _trace
from ..tensor import Tensor as _Tensor
from ..tensor import detached as _detached
from ..versions import UNWRITTEN as _UNWRITTEN, Version as _Version, memory_owner as _root, \
    version_of as _version_of
from ..autograd.views import refresh_view as _refresh_view, take_view as _take_view

__all__ = ["Primitive", "defvjp", "PrimitiveNode", "NO_KWARGS"]

Rule = Optional[Callable[..., Any]]
NO_KWARGS: Mapping[str, Any] = MappingProxyType({})  # the keywords of a call without any (shared, read-only)


class Primitive:
    """A named numpy function; differentiable once ``defvjp`` gives it rules."""

    __slots__ = ("name", "fn", "vjps", "reads_ans", "reads_args", "unread", "rule_reads", "ans_rules", "standin")

    def __init__(self, name: str, fn: Callable[..., Any]) -> None:
        self.name = name
        self.fn = fn
        self.vjps: Optional[Tuple[Rule, ...]] = None
        self.reads_ans = True  # a rule reads the op's output: its node keeps it and checks its version
        self.reads_args: Tuple[bool, ...] = ()  # per argument: a rule reads its values (its version is checked)
        self.unread: Optional[_Unread] = None  # what the rules get as ans when they do not read it
        # declared per rule (else None): which arguments each rule reads, and which rules read ans; a node
        # then checks (and packs) only what the rules of the inputs that need a gradient read, as torch saves
        self.rule_reads: Optional[Tuple[Tuple[bool, ...], ...]] = None
        self.ans_rules: Optional[Tuple[bool, ...]] = None
        self.standin: Optional[_Unread] = None

    def __call__(self, *args: Any, **kwargs: Any):
        """Apply to Tensors (already converted); record a node if needed (see ``call``)."""
        return self.call(args, kwargs)

    def call(self, args: Tuple[Any, ...], kwargs: Mapping[str, Any] = NO_KWARGS):
        """``self(*args, **kwargs)``, the one path of every primitive call: the op entry (op_entry.py's
        check, inlined), the function, the result Tensor, its node. Called directly (no ``*``/``**``
        repacking) by the binary ops, whose operands come as a tuple already."""
        if _flag.value and _trace.tracer is not None:  # a trace records this thread's ops
            return _trace.tracer.call_op("primitive", self.name, self, args, kwargs)
        # the inputs' versions as the function reads them: numpy may release the GIL, and a write from
        # another thread meanwhile must fail this node's backward, not be read by it (torch's order too)
        versions = None
        try:
            if len(args) == 2 and not kwargs:  # most ops: no list built, no **{}
                x, y = args
                if x._base_ref is not None or y._base_ref is not None:  # a view: its history may be stale
                    _refresh_views(args)
                if x.requires_grad or y.requires_grad:
                    versions = (x._vc.value, y._vc.value)
                out = self.fn(x._data, y._data)
            else:
                for a in args:
                    if a._base_ref is not None:
                        _refresh_views(args)
                        break
                for a in args:
                    if a.requires_grad:
                        versions = tuple(map(_version_of, args))
                        break
                out = self.fn(*[a._data for a in args], **kwargs)
        except TypeError:  # numpy and CuPy arrays in one call: say so, naming both devices
            _device.check_same(args, f"op '{self.name}'")
            raise
        except ValueError as e:
            err = _value_error(self.name, args, e)
            if err is e:
                raise
            raise err from e
        if type(out) is not np.ndarray:
            out = _result(out, args, self.name)
        res = _new(_Tensor)
        res._base_ref = None
        res._data = out
        if out.base is not None:  # a view (reshape, slice...): maybe of an input
            _share_input_version(res, out, args)
        for a in args:
            if a.requires_grad:  # first (a slot read): most calls end here, without reading the grad mode
                if _state.enabled and self.vjps is not None and out.dtype.kind in "fcV":  # integers: no gradient (dtypes.GRAD_KINDS)
                    res._node = _record(self, args, kwargs, out, res, versions=versions)
                    res.requires_grad = True
                break
        return res

    def __repr__(self) -> str:
        return f"<primitive {self.name}>"

    def live_reads(self, live: Sequence[bool]) -> Tuple[Tuple[bool, ...], bool]:
        """What the rules of the arguments marked in ``live`` (those that need a gradient) read: per
        argument whether its values are read, and whether ans is."""
        per = self.rule_reads
        if per is None:
            return self.reads_args, self.reads_ans
        n = len(per[0]) if per else 0
        args = tuple(any(live[r] and per[r][i] for r in range(len(per)) if r < len(live)) for i in range(n))
        ans = any(live[r] and self.ans_rules[r] for r in range(len(per)) if r < len(live))
        return args, ans


def _value_error(name: str, args: Sequence[Any], e: ValueError) -> BaseException:
    """What a ValueError of the function means for the op's caller: shapes that do not broadcast,
    or (numpy's "array is too big", "iterator is too large") a result whose size overflows; else ``e``
    itself."""
    if "could not be broadcast" in str(e):
        return ValueError(f"op '{name}': the shapes of its inputs "
                          f"{[list(a.shape) for a in args]} do not broadcast together")
    if "too big" not in str(e) and "iterator is too large" not in str(e):  # (its bytes; its element count)
        return e
    return MemoryError(f"op '{name}': cannot allocate its result for inputs of shapes "
                       f"{[list(a.shape) for a in args]} and dtypes {', '.join(str(a.dtype) for a in args)}: "
                       f"its size in bytes overflows")


def _refresh_views(args: Sequence[Any]) -> None:
    """Before an op reads views (tensors with a ``_base_ref``) while recording: a view whose memory
    was written since its history was set gets its history from its base's (call_rules.refresh_view)."""
    if not _state.enabled:
        return
    for a in args:
        if a._base_ref is not None and a._vc.value != a._view_version:
            _refresh_view(a)


def _share_input_version(res: Any, out: Any, args: Sequence[Any]) -> None:
    """``out`` views an input's memory: ``res`` counts writes on that input's version counter,
    so a write through either is seen by the version checks of nodes that saved the other, and
    its ``_base`` is that input's (or the input), so an in-place write into it rebases the base."""
    root = _root(out)
    for a in args:
        if _root(a._data) is root:
            _take_view(res, a)
            return


def _result(out: Any, args: Sequence[Any], name: str) -> Any:
    """A result that is not a plain ndarray: a numpy scalar made an array, or a GPU array
    (then every input must have been on its device)."""
    if _device.is_device_array(out):
        _device.check_same(args, f"op '{name}'")
        return out
    return np.asarray(out)


def defvjp(prim: Primitive, *rules: Rule, reads_output: Union[bool, Iterable[int]] = True,
           reads_inputs: Union[None, Iterable[int], Mapping[int, Iterable[int]]] = None) -> None:
    """Register derivative rules, one per positional argument (None: not differentiable), and
    declare what they read, so that backward checks exactly those against in-place writes.

    ``reads_output``: some rule reads ``ans``; then the node keeps the output and its version is
    checked; with False the rules are given a stand-in that raises when used, so an undeclared
    read fails loudly. ``reads_inputs``: the positions of the arguments whose values some rule
    reads (None, the default: all); an argument left out may be written in place before
    backward (its shape, dtype and device are all a rule may use).

    Per rule, as torch saves only what the gradients it computes need: ``reads_inputs`` a mapping
    from a rule's position to the positions it reads (a rule not in it reads none), and
    ``reads_output`` the positions of the rules that read ``ans``. Then a write into a value only
    the rules of inputs that need no gradient read is allowed (mul's ``x`` when only ``x`` needs one)."""
    if not isinstance(prim, Primitive):
        raise TypeError(f"defvjp: the first argument must be a Primitive, got {type(prim).__name__}")
    n = len(rules)
    per_rule = isinstance(reads_inputs, Mapping)
    if type(reads_output) is bool:
        ans_rules = (reads_output,) * n
    else:
        ans_rules = _positions(prim, "reads_output", reads_output, n, "rules")
        per_rule = True
    if reads_inputs is None:
        by_rule = ((True,) * n,) * n
    elif isinstance(reads_inputs, Mapping):
        rows = _positions(prim, "reads_inputs' rules", reads_inputs.keys(), n, "rules")
        by_rule = tuple(_positions(prim, f"reads_inputs[{r}]", reads_inputs[r], n, "argument(s)")
                        if rows[r] else (False,) * n for r in range(n))
    else:
        row = _positions(prim, "reads_inputs", reads_inputs, n, "argument(s)")
        by_rule = (row,) * n
    prim.vjps = tuple(rules)
    prim.reads_ans = any(ans_rules)
    prim.reads_args = tuple(any(by_rule[r][i] for r in range(n)) for i in range(n))
    prim.unread = None if prim.reads_ans else _Unread(prim.name)
    prim.standin = prim.unread or _Unread(prim.name)
    prim.rule_reads = by_rule if per_rule else None
    prim.ans_rules = ans_rules if per_rule else None


def _positions(prim: Primitive, what: str, given: Any, n: int, of: str) -> Tuple[bool, ...]:
    """``given`` (positions among ``n``) as a row of flags; a ValueError names a bad one."""
    if isinstance(given, (str, bytes)) or not isinstance(given, Iterable):
        raise TypeError(f"defvjp({prim.name}): {what} must be {'True, False or ' if what == 'reads_output' else ''}"
                        f"a collection of positions, got {given!r}")
    given = tuple(given)
    bad = [i for i in given if type(i) is not int or not 0 <= i < n]
    if bad:
        raise ValueError(f"defvjp({prim.name}): {what} {list(given)} must be positions of its "
                         f"{n} {of}, 0 to {n - 1}")
    return tuple(i in given for i in range(n))


class _Unread:
    """``ans`` for rules declared not to read it (``reads_output=False``): any use raises, so a rule
    that reads the output without saying so fails loudly instead of reading a value nobody checked."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def __getattr__(self, attr: str) -> Any:
        raise RuntimeError(f"a derivative rule of {object.__getattribute__(self, '_name')} reads its output "
                           f"(ans), but defvjp was given reads_output=False; declare reads_output=True")

    def __repr__(self) -> str:
        return f"<output of {object.__getattribute__(self, '_name')}: not read by its rules>"


class PrimitiveNode(Node):
    """A recorded primitive call. Its ``input_meta`` is built when first asked (recording builds
    no tuples for it), from the saved arguments (a backward first checks that their versions
    are unchanged), and kept when ``release`` frees them. The output is kept (and checked) only
    when the rules read it."""

    __slots__ = ("prim", "args", "kwargs", "versions", "out", "out_ref", "out_vc", "out_version", "_input_meta")

    def __init__(self, prim: Primitive, args: Sequence[Any], kwargs: Dict[str, Any], out: np.ndarray,
                 res: Any = None) -> None:
        _record(prim, args, kwargs, out, res, self)

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
        two = len(args) == 2
        if two:  # most ops: the two versions read without a map
            x, y = args
            if (x._vc.value, y._vc.value) != self.versions:
                self._stale()
        elif tuple(map(_version_of, args)) != self.versions:
            self._stale()
        prim = self.prim
        ans = prim.unread
        if ans is None and prim.ans_rules is not None and not prim.live_reads(self._live())[1]:
            ans = prim.standin  # declared per rule: only the rules of inputs that need no gradient read it
        if ans is None:  # the rules read the output
            ref = self.out_ref  # the output must be as the op made it (its counter, once it is gone: a
            t = None if ref is None else ref()  # local of the caller's loss function written in place)
            vc = t._vc if t is not None else self.out_vc
            if vc is not None and vc.value != self.out_version:
                raise RuntimeError(f"one of the tensors needed for gradient computation has been modified by an "
                                   f"in-place operation: output 0 of {self.name} is at version {vc.value}; "
                                   f"expected version {self.out_version}")
            ans = _new(_Tensor)
            ans._base_ref = None
            ans._data = self.out
            if create_graph:
                ans._node = self
                ans.requires_grad = True
        g = grads[0]
        kw = self.kwargs
        vjps = prim.vjps
        edges = self.next_edges
        if two and not kw:  # a binary op: no comprehension, no **{}
            r0, r1 = vjps
            e0, e1 = edges
            return [None if (e0 is None or r0 is None) else r0(g, ans, x, y),
                    None if (e1 is None or r1 is None) else r1(g, ans, x, y)]
        return [None if (e is None or rule is None) else rule(g, ans, *args, **kw)
                for rule, e in zip(vjps, edges)]

    def _live(self) -> Tuple[bool, ...]:
        """Per argument: its gradient is computed (an edge, and a rule for it)."""
        return tuple([e is not None and r is not None for e, r in zip(self.next_edges, self.prim.vjps)])

    def _stale(self) -> None:
        """Raise for the first changed argument whose values a rule that runs reads (the others may change)."""
        reads = self.prim.live_reads(self._live())[0]
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


class HookedPrimitiveNode(PrimitiveNode):
    """A primitive call recorded inside ``saved_tensors_hooks`` (runtime/autograd/saved_hooks.py): what its
    rules read (the arguments whose values they read, the output if they read it) went to the pack hook
    when it was recorded, and backward reads the unpack hook's tensors instead, with no version check
    (what pack kept is the hook's), as torch does for its own ops' saved tensors. A plain call records a
    ``PrimitiveNode``: the common call pays one read of a process-wide count (grad_mode.hooks_open) for this."""

    __slots__ = ("packed", "unpack_hook")

    def apply(self, grads, create_graph):
        args = self.args
        if args is None:
            raise RuntimeError(f"backward through {self.name} a second time: its saved tensors were "
                               f"freed after the first backward; pass retain_graph=True the first time")
        prim = self.prim
        packed_args, packed_out = self.packed
        edges = self.next_edges
        vals = list(args)
        for i, p in enumerate(packed_args):
            if p is not _NOT_SAVED:  # its values are read: the hook's tensor, over the argument's history
                vals[i] = _unpacked(self.unpack_hook, p, self.name, f"argument {i}",
                                    edges[i] if create_graph else None, self.input_meta[i])
        if packed_out is _NOT_SAVED:  # the rules that run do not read the output
            ans = prim.standin
        else:
            ans = _unpacked(self.unpack_hook, packed_out, self.name, "its output")
            if create_graph:
                ans._node, ans._out_index, ans.requires_grad = self, 0, True
        g = grads[0]
        kw = self.kwargs
        return [None if (e is None or rule is None) else rule(g, ans, *vals, **kw)
                for rule, e in zip(prim.vjps, edges)]

    def release(self) -> None:
        super().release()
        self.packed = ((), _NOT_SAVED)


_NOT_SAVED = object()  # an argument whose values no rule reads: not packed (its shape and dtype are kept)


def _pack(node: HookedPrimitiveNode, hooks: Any, args: Sequence[Any], out: Any, res: Any) -> None:
    """Give the pack hook what ``node``'s rules read: each argument whose values they read, and the
    output if they read it, each as a tensor over its memory outside the graph (torch's rule)."""
    pack = hooks[0]
    prim = node.prim
    reads, reads_ans = prim.live_reads(node._live())  # what the rules that will run read, as torch saves
    packed_args = tuple([pack(_detached(a)) if (i >= len(reads) or reads[i]) else _NOT_SAVED
                         for i, a in enumerate(args)])
    packed_out = _NOT_SAVED
    if reads_ans:
        packed_out = pack(_detached(res) if res is not None else _Tensor._from_array(out))
    node.packed = (packed_args, packed_out)
    node._input_meta = tuple([(a._data.shape, a._data.dtype) for a in args])
    node.args = tuple([a if p is _NOT_SAVED else None for a, p in zip(args, packed_args)])  # not kept alive
    node.unpack_hook = hooks[1]
    node.out = None  # backward reads the unpack hook's output, never the live one
    node.out_ref = node.out_vc = None


_new = object.__new__
_weakref = weakref.ref


def _record(prim: Primitive, args: Sequence[Any], kwargs: Dict[str, Any], out: np.ndarray, res: Any,
            node: Optional[PrimitiveNode] = None, versions: Optional[Tuple[int, ...]] = None) -> PrimitiveNode:
    """A node (or ``node``) for ``res = prim(*args, **kwargs)`` with its fields set in one pass
    (the recording hot path); the output is kept, and referenced weakly for its version check, only
    when the rules read it."""
    if node is None:
        # saved_tensors_hooks in force: the node packs what its rules read (none open anywhere: no lookup)
        if _hooks_open[0] and _state.saved_hooks is not None:
            return _record_hooked(prim, args, kwargs, out, res, versions)
        node = _new(PrimitiveNode)
    node.prim = prim
    node.args = args
    node.kwargs = kwargs
    if prim.reads_ans:
        node.out = out
        if res is None:
            node.out_ref = node.out_vc = None
            node.out_version = 0
        else:
            node.out_ref = _weakref(res)
            vc = res._vc  # its memory's counter, held apart from it (versions.counter, inlined: a hot path)
            if vc is _UNWRITTEN:
                res._vc = vc = _Version()
            node.out_vc = vc
            node.out_version = vc.value  # not 0 for a view of a written input
    else:
        node.out = node.out_ref = node.out_vc = None
    node._input_meta = None
    if len(args) == 2:  # most recorded ops: no comprehension for two arguments
        x, y = args
        # as the function read them (call); _version without its property's call
        node.versions = versions if versions is not None else (x._vc.value, y._vc.value)
        node.next_edges = ((x if x._node is None else (x._node, x._out_index)) if x.requires_grad else None,
                           (y if y._node is None else (y._node, y._out_index)) if y.requires_grad else None)
    else:
        node.versions = versions if versions is not None else tuple(map(_version_of, args))
        node.next_edges = tuple([(a if a._node is None else (a._node, a._out_index)) if a.requires_grad else None
                                 for a in args])
    node.out_meta = ((out.shape, out.dtype),)
    return node


def _record_hooked(prim: Primitive, args: Sequence[Any], kwargs: Dict[str, Any], out: np.ndarray,
                   res: Any, versions: Optional[Tuple[int, ...]] = None) -> PrimitiveNode:
    """``_record`` inside saved_tensors_hooks: the node's saved values go through the pack hook."""
    node = _record(prim, args, kwargs, out, res, _new(HookedPrimitiveNode), versions)
    _pack(node, _state.saved_hooks, args, out, res)
    return node

