"""``Function``: an operator written in Python (numpy) with its own backward.

    class Exp(Function):
        @staticmethod
        def forward(ctx, x):
            out = Tensor(np.exp(x.asnumpy()))
            ctx.save_for_backward(out)
            return out

        @staticmethod
        def backward(ctx, grad):
            out, = ctx.saved_tensors
            return grad * out

    y = Exp.apply(x)

The contract is the C++ ``Function<T>``'s (include/opbuilder/autograd.h) in
Python names: ``forward`` runs with recording off and returns a Tensor (or a
numpy array) or a tuple of them; ``backward`` gets one gradient per output and
returns one per ``forward`` argument (``None`` for none). The ``ctx`` has
``save_for_backward``/``saved_tensors`` (version-checked),
``needs_input_grad``, ``mark_dirty``, ``mark_non_differentiable``,
``set_materialize_grads``, and takes any other attribute for backward.

Higher order: ``backward`` runs with recording on when a higher-order gradient
is asked for, so one written with runtime ops is differentiable. A gradient it
returns as a numpy array, or every gradient of a backward decorated with
``once_differentiable``, cannot be differentiated again: asking is a clear error.
"""
from __future__ import annotations

import random
import os
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

import numpy as np

from . import engine
from .grad_mode import _state
from .saved_hooks import hooks_in_force
from .node import Node, edge_of, meta_of
from .ownership import own_results
from .. import call_rules as _call_rules
from .. import device as _device
from .. import tensor as _tensor
from ..ops.op_entry import op_entry
from ..versions import counter as _counter

__all__ = ["Function", "FunctionCtx", "once_differentiable"]

F = TypeVar("F", bound=Callable[..., Any])

# Inputs of up to this many bytes are compared whole; larger ones by samples, unless
# OPBUILDER_CHECK_WRITES=full asks for every byte (exact, at a full pass over each input).
_FULL_BYTES = 4096 if os.environ.get("OPBUILDER_CHECK_WRITES", "") != "full" else float("inf")
_SAMPLES = 256


def once_differentiable(backward: F) -> F:
    """Mark a ``backward`` (numpy code, say) whose results cannot be differentiated again."""
    backward._once_differentiable = True  # type: ignore[attr-defined]
    return backward


def _fingerprint(arr: np.ndarray, phase: float) -> bytes:
    """The bytes of ``arr`` (small arrays) or of evenly spaced samples of it (large ones)."""
    if arr.nbytes <= _FULL_BYTES:
        return arr.tobytes()
    step = arr.size // _SAMPLES
    flat = np.arange(_SAMPLES) * step + int(phase * step)
    return arr[np.unravel_index(flat, arr.shape)].tobytes()


class _Hooked:
    """A saved tensor kept by saved_tensors_hooks' pack (saved_hooks.py): backward reads unpack(packed)."""

    __slots__ = ("unpack", "packed")

    def __init__(self, unpack: Callable[[Any], Any], packed: Any) -> None:
        self.unpack, self.packed = unpack, packed


class _SavedOutput:
    """An output kept for backward without keeping its Python object (no cycle through the node)."""

    __slots__ = ("data", "ref", "vc", "index", "version")

    def __init__(self, out: Any, index: int) -> None:
        self.data = out._data
        self.ref = weakref.ref(out)
        self.vc = _counter(out)  # its memory's counter: a write after the output itself is gone still shows
        self.index = index
        self.version = out._version

    def unpack(self, node: Optional[Node]) -> Any:
        """A tensor over the output's data; in a higher-order pass, with the output's history."""
        t = _tensor.Tensor._from_array(self.data)
        if node is not None:
            t._node, t._out_index, t.requires_grad = node, self.index, True
        return t


class FunctionCtx:
    """What ``forward`` leaves for ``backward``."""

    def __init__(self, name: str, needs_input_grad: Tuple[bool, ...]) -> None:
        self.needs_input_grad = needs_input_grad
        self._fn_name = name
        self._saved_raw: Tuple[Any, ...] = ()
        self._saved: Optional[List[Any]] = None  # set when the node is recorded
        self._released = False
        self._dirty: List[Any] = []
        self._non_differentiable: List[Any] = []
        self._materialize = True
        self._backward_node: Optional[Node] = None  # the node, while a create_graph backward runs

    def save_for_backward(self, *tensors: Any) -> None:
        """Keep tensors (inputs, outputs or others; None allowed) for backward."""
        for i, t in enumerate(tensors):
            if t is not None and not isinstance(t, _tensor.Tensor):
                raise TypeError(f"{self._fn_name}: save_for_backward takes Tensors (or None), got "
                                f"{type(t).__name__} at position {i}; keep other values as ctx attributes")
        self._saved_raw = tensors

    @property
    def saved_tensors(self) -> Tuple[Any, ...]:
        """The saved tensors; an error naming the Function and slot if one changed in place since."""
        if self._released:
            raise RuntimeError(f"{self._fn_name}: saved tensors were freed after the first backward; "
                               f"pass retain_graph=True")
        if self._saved is None:
            return tuple(self._saved_raw)
        out = []
        for i, s in enumerate(self._saved):
            if s is None:
                out.append(None)
                continue
            if isinstance(s, _Hooked):  # what the unpack hook returns, unchecked (what pack kept is the hook's)
                t = s.unpack(s.packed)
                if not isinstance(t, _tensor.Tensor):
                    raise TypeError(f"{self._fn_name}: the saved_tensors_hooks unpack hook returned a "
                                    f"{type(t).__name__} for saved slot {i}; it must return a runtime.Tensor")
                out.append(t)
                continue
            if isinstance(s, _SavedOutput):
                live = s.ref()
                t, version = s.unpack(self._backward_node), s.version
                now = live._version if live is not None else s.vc.value
            else:
                t, version, aliases = s
                now = t._version
                for ref, v in aliases:
                    live = ref()
                    if now == version and live is not None and live._version != v:
                        now, version = live._version, v
            if now != version:
                raise RuntimeError(f"one of the tensors saved for backward by {self._fn_name} (saved slot {i}) "
                                   f"has been modified by an in-place operation: it is at version {now}, "
                                   f"but was saved at version {version}")
            out.append(t)
        return tuple(out)

    def mark_dirty(self, *tensors: Any) -> None:
        """These arguments were modified in place by forward, which returns them."""
        self._dirty.extend(tensors)

    def mark_non_differentiable(self, *tensors: Any) -> None:
        """These outputs get no gradient and have ``requires_grad == False``."""
        self._non_differentiable.extend(tensors)

    def set_materialize_grads(self, value: bool) -> None:
        """False: gradients of unused outputs arrive as None instead of zeros."""
        self._materialize = bool(value)


def _contains(items: Sequence[Any], x: Any) -> bool:
    return any(i is x for i in items)


class FunctionNode(Node):
    """The node a ``Function.apply`` records."""

    __slots__ = ("_fn", "_ctx")
    strict = True

    def __init__(self, fn: type, ctx: FunctionCtx, args: Sequence[Any], outputs: Sequence[Any]) -> None:
        Tensor = _tensor.Tensor
        self._fn = fn
        self._ctx = ctx
        self.next_edges = tuple(edge_of(a) if need else None for a, need in zip(args, ctx.needs_input_grad))
        self.input_meta = tuple(meta_of(a) if isinstance(a, Tensor) else None for a in args)
        self.out_meta = tuple(meta_of(o) for o in outputs)

    @property
    def name(self) -> str:  # type: ignore[override]
        return self._fn.__name__

    @property
    def materialize_grads(self) -> bool:  # type: ignore[override]
        return self._ctx._materialize

    @property
    def differentiable(self) -> bool:  # type: ignore[override]
        return not getattr(self._fn.backward, "_once_differentiable", False)

    def apply(self, grads, create_graph):
        ctx = self._ctx
        if ctx._released:
            raise RuntimeError(f"backward through {self.name} a second time: what it saved was freed "
                               f"after the first backward; pass retain_graph=True the first time")
        ctx._backward_node = self if create_graph else None
        try:
            res = self._fn.backward(ctx, *grads)
        finally:
            ctx._backward_node = None
        res = list(res) if isinstance(res, (tuple, list)) else [res]
        once = None
        for i, r in enumerate(res):
            if r is None or i >= len(self.input_meta):
                continue
            if self.input_meta[i] is None:
                raise RuntimeError(f"backward of {self.name} returned a gradient for argument {i}, "
                                   f"which is not a tensor")
            if create_graph and isinstance(r, np.ndarray):  # computed outside the graph
                if once is None:
                    once = engine.once_differentiable_sources(self, grads)
                t = _tensor.Tensor._from_array(r)
                if once:
                    t.requires_grad = True
                    t._node = engine._OnceDifferentiable(f"{self.name} (its gradient {i} is a numpy array)",
                                                         once, t)
                res[i] = t
        r = t = None  # (the loop's names would count as references to a result)
        own_results(res, grads, create_graph)  # a saved or input tensor returned as a gradient: copied
        return res

    def release(self) -> None:
        self._ctx._released = True
        self._ctx._saved = None


def _bound_args(cls: type, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[Any, ...]:
    """``args`` and ``kwargs`` as forward's positional arguments (after ctx), defaults filled in."""
    import inspect
    params = list(inspect.signature(cls.forward).parameters.values())[1:]  # without ctx
    try:
        bound = inspect.Signature(params).bind(*args, **kwargs)
    except TypeError as e:
        raise TypeError(f"{cls.__name__}.apply: {e}") from None
    bound.apply_defaults()
    if bound.kwargs:  # keyword-only parameters: backward could not say which gradient is whose
        raise TypeError(f"{cls.__name__}.apply: forward's keyword-only parameters {sorted(bound.kwargs)} "
                        f"cannot be passed to a Function; make them positional")
    return tuple(bound.args)


class Function:
    """Base class of Python operators with a custom backward; call ``MyFunction.apply(*args)``."""

    @staticmethod
    def forward(ctx: FunctionCtx, *args: Any) -> Any:
        raise NotImplementedError("a Function must define forward(ctx, *args)")

    @staticmethod
    def backward(ctx: FunctionCtx, *grad_outputs: Any) -> Any:
        raise NotImplementedError("a Function must define backward(ctx, *grad_outputs)")

    @classmethod
    @op_entry("function", lambda cls: cls.__name__, target=lambda cls: cls.apply)  # traced: one node
    def apply(cls, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        """``apply(*args, **kwargs)``: run ``forward`` (recording off) and, if any argument needs grad,
        record one node. Keywords are bound to forward's parameters first (torch's rule), so backward
        returns one gradient per forward parameter, in order, whichever way it was passed."""
        if kwargs:
            args = _bound_args(cls, args, kwargs)
        Tensor = _tensor.Tensor
        name = cls.__name__
        enabled = _state.enabled
        if enabled:  # a view whose base was written since its history was set: its history anew (call_rules)
            for a in args:
                if isinstance(a, Tensor) and a._base_ref is not None and a._vc.value != a._view_version:
                    _call_rules.refresh_view(a)
        needs = tuple(enabled and isinstance(a, Tensor) and a.requires_grad for a in args)
        record = any(needs)
        ctx = FunctionCtx(name, needs)
        before = None
        if record:
            phase = random.random()
            before = [(a._data, _fingerprint(a._data, phase)) if isinstance(a, Tensor) else None for a in args]
        # the arguments a write would be refused for, decided before forward runs (runtime/call_rules.py),
        # kept only while this class may write them (call_rules.keeps_arguments)
        writes = cls.__dict__.get(_call_rules.WRITES_ATTR)
        keeps = writes is not False
        guard = _call_rules.protect(args, name, record, "mark_dirty") if keeps else None
        _state.enabled = False
        try:
            result = cls.forward(ctx, *args)
        finally:
            _state.enabled = enabled
            if ctx._dirty and writes is not True:  # this class writes: its later calls keep
                _call_rules.note_writes(cls)
        if guard is not None:
            _check_refusals(cls, ctx, args, guard)
        elif not keeps and ctx._dirty:  # the same rules, decided now: nothing was kept
            _late_refusal(name, ctx, args, record)
        single = not isinstance(result, (tuple, list))
        outs = [_as_output(name, o) for o in ([result] if single else result)]
        _finish_dirty(name, ctx, args, outs)
        if record:
            _check_forward_writes(cls, ctx, args, before, phase)
            if len(outs) > 1:
                _check_dirty_view_outputs(name, ctx, args)
            outs = _record(cls, ctx, args, outs)
            rebased: List[Any] = []  # a view written in place: its base's history is rebased, once per
            for i, a in enumerate(args if ctx._dirty else ()):  # view (one passed twice is one write)
                if isinstance(a, Tensor) and a._base is not None and _contains(ctx._dirty, a) \
                        and not _contains(rebased, a):
                    rebased.append(a)
                    _call_rules.rebase_view(a, i)
            if writes is None and not ctx._dirty:  # a recorded call completed without writing
                _call_rules.note_read_only_call(cls)
        else:
            outs = [_alias(o) if _contains(args, o) and not _contains(ctx._dirty, o) else o
                    for o in outs]
        return outs[0] if single else tuple(outs)


def _check_dirty_view_outputs(name: str, ctx: FunctionCtx, args: Tuple[Any, ...]) -> None:
    """torch's rule (and C++ Function<T>'s, src/core/autograd.cpp): a Function that wrote a view in place
    returns one tensor, since the view's base is rebased through one output only (a view marked
    non-differentiable is not rebased). Raised after forward, as torch raises it: the write stays done
    and counted."""
    for i, a in enumerate(args):
        if isinstance(a, _tensor.Tensor) and _contains(ctx._dirty, a) and a._base is not None \
                and a._data.dtype.kind in "fcV" and not _contains(ctx._non_differentiable, a):
            raise RuntimeError(f"{name}: forward wrote argument {i} in place (mark_dirty), a view of another tensor, "
                               f"and returned more than one tensor; as in torch, a Function that writes a view "
                               f"returns one tensor. Pass a copy (x * 1), or split it into a Function that writes "
                               f"and returns only that tensor and one that computes the rest")


def _alias(arg: Any) -> Any:
    """A new tensor over the memory of ``arg``, an argument returned unchanged by forward: a view of it
    (call_rules.share_alias), as torch makes a custom Function's output that is its input."""
    t = _tensor.Tensor._from_array(arg._data)
    _call_rules.share_alias(t, arg)
    return t


def _as_output(name: str, o: Any) -> Any:
    Tensor = _tensor.Tensor
    if isinstance(o, Tensor):
        return o
    if isinstance(o, np.ndarray):
        return _tensor._shared(o)  # the forward's own array, not copied
    raise TypeError(f"{name}.forward returned {type(o).__name__}; it must return Tensors (or numpy arrays)")


def _check_refusals(cls: type, ctx: FunctionCtx, args: Sequence[Any], guard: "_call_rules.Protected") -> None:
    """A protected argument (one a write is refused for) marked dirty, or changed without mark_dirty:
    its values are put back, then the refusal decided before forward is raised."""
    name = cls.__name__
    for i, a in enumerate(args):
        err = guard.refusal(i)
        if err is None:
            continue
        if _contains(ctx._dirty, a):
            guard.restore()
            raise err
        if guard.changed(i):
            _call_rules.note_writes(cls)
            guard.restore()
            raise RuntimeError(f"{name}.forward modified argument {i} in place without mark_dirty; mark it "
                               f"(ctx.mark_dirty(tensor)) and return it, or compute a new tensor")


def _finish_dirty(name: str, ctx: FunctionCtx, args: Sequence[Any], outs: Sequence[Any]) -> None:
    """Dirty tensors are arguments, returned by forward; their versions go up."""
    seen: List[Any] = []
    for d in ctx._dirty:
        if not _contains(args, d):
            raise RuntimeError(f"{name}: mark_dirty was given a tensor that is not an argument of forward")
        if not _contains(seen, d):
            seen.append(d)
            d._version += 1
    for d in ctx._dirty:
        if not _contains(outs, d):
            i = next(k for k, a in enumerate(args) if a is d)
            raise RuntimeError(f"{name}: argument {i} was given to mark_dirty but not returned by forward; "
                               f"an argument modified in place must be returned as an output")


def _late_refusal(name: str, ctx: FunctionCtx, args: Sequence[Any], record: bool) -> None:
    """For a call that kept nothing (its class had written nothing before): an argument marked dirty that a
    write is refused for is refused now, by the rules decided before forward (from what forward does not
    change). Its memory may hold the write (the one hole, runtime/call_rules.py): its version goes up."""
    for d in ctx._dirty:
        i = next((k for k, a in enumerate(args) if a is d), None)
        if i is None:
            continue  # _finish_dirty names that misuse
        err = _call_rules.write_refusal(d, name, i, record, "mark_dirty") if isinstance(d, _tensor.Tensor) else None
        if err is not None:
            d._version += 1
            raise err


def _check_forward_writes(cls: type, ctx: FunctionCtx, args: Sequence[Any], before, phase: float) -> None:
    """Arguments changed without mark_dirty, and dirty leaves that require grad, are errors."""
    name = cls.__name__
    for i, (a, b) in enumerate(zip(args, before)):
        if b is None or _contains(ctx._dirty, a) or any(_write_reaches(d, a) for d in ctx._dirty):
            continue  # (another argument over the same memory, marked dirty: that write explains the change)
        data, fp = b
        if a._data is not data or _fingerprint(data, phase) != fp:
            _call_rules.note_writes(cls)
            a._version += 1  # it did change
            raise RuntimeError(f"{name}.forward modified argument {i} in place without mark_dirty; mark it "
                               f"(ctx.mark_dirty(tensor)) and return it, or compute a new tensor")
    for d in ctx._dirty:
        if d.requires_grad and d._node is None:
            i = next(k for k, a in enumerate(args) if a is d)
            raise RuntimeError(f"{name} modifies argument {i} in place (mark_dirty), but it is a leaf that "
                               f"requires grad; in-place changes of such leaves are not allowed "
                               f"(use a copy, e.g. x * 1)")


def _write_reaches(d: Any, a: Any) -> bool:
    """A write into ``d`` may have changed ``a``: their memory overlaps (C++'s WriteReaches)."""
    x, y = d._data, a._data
    if type(x) is not type(y):
        return False
    if type(x) is np.ndarray:  # exact: interleaved views (y[::2], y[1::2]) share bounds, not elements
        return bool(np.shares_memory(x, y))
    try:
        return bool(_device.array_module(x).may_share_memory(x, y))
    except (AttributeError, TypeError):
        return False


def _record(cls: type, ctx: FunctionCtx, args: Sequence[Any], outs: List[Any]) -> List[Any]:
    """Make ``outs`` the results of a new node and keep what was saved."""
    returned = list(outs)
    final: List[Any] = []
    for o in outs:
        in_place = _contains(ctx._dirty, o) and not _contains(final, o)
        if not in_place and _contains(args, o) and not _contains(final, o):
            o = _alias(o)  # an argument returned unchanged: a view of it (call_rules.share_alias)
        elif not in_place and (_contains(args, o) or _contains(final, o) or o._node is not None or o.requires_grad):
            o = _tensor.detached(o)  # never rewrite the history of a tensor that is not ours (its memory and counter)
        final.append(o)
    node = FunctionNode(cls, ctx, args, final)
    for j, (o, r) in enumerate(zip(final, returned)):
        if not _contains(ctx._non_differentiable, r) and o._data.dtype.kind in "fcV":  # integer outputs: no gradient
            o._node, o._out_index, o.requires_grad = node, j, True
    saved: List[Any] = []
    for s in ctx._saved_raw:
        j = next((k for k, r in enumerate(returned) if r is s), None)
        if s is None:
            saved.append(None)
        elif j is not None and _contains(args, s) and not _contains(ctx._dirty, s):
            # an argument returned unchanged goes out as a new tensor over its memory: a write
            # through either changes what was saved, so watch the argument and each such output
            aliases = tuple((weakref.ref(o), o._version) for o, r in zip(final, returned) if r is s)
            saved.append((s, s._version, aliases))
        elif j is not None:
            saved.append(_SavedOutput(final[j], j))
        else:
            saved.append((s, s._version, ()))
    hooks = hooks_in_force()
    if hooks is not None:  # saved_tensors_hooks: each goes to pack as a tensor outside the graph
        saved = [None if s is None else _Hooked(hooks[1], hooks[0](_tensor.detached(r)))
                 for s, r in zip(saved, ctx._saved_raw)]
    ctx._saved = saved
    ctx._saved_raw = ()
    return final
