"""Recording a graph while a function runs eagerly (``capture_mode="trace"``).

Every op the function calls runs as usual (with tracing paused inside it, so
an op built from other ops is one node) and is recorded as one ``Node``;
tensors are told apart by identity: an argument is an ``Input``, an op's
result an ``Output``, any other tensor a ``Const`` (captured by reference).
Python control flow and Python values are fixed at trace time.

The trace is the call: it runs with the caller's grad mode and its result is
the call's result, so each op (an in-place one too) runs once on the call
that traces. What a graph cannot hold (tracing.no_trace) stops the
recording there, and the rest of that call runs eagerly.
"""
from __future__ import annotations

import os
import sys
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..autograd.grad_mode import _state as _grad_state
from ..autograd.views import ViewOfBase
from ..graph.graph import Const, Graph, Input, Node, Output, Ref
from ..tensor import _TRACING, Tensor, detached
from ..versions import UNWRITTEN
from .tracing import flag, hook

__all__ = ["Tracer", "OutputShapeChanged"]


_COUNT_LOCK = threading.Lock()  # the counters every thread's traces share (_TRACING, flag)


class Tracer:
    """Collects the nodes of one trace; ``with tracer:`` makes it this thread's active tracer."""

    def __init__(self, inputs: Sequence[Tensor], name: str) -> None:
        self.graph = Graph([tuple(t._data.shape) for t in inputs], [t._data.dtype for t in inputs], name=name)
        self._refs: Dict[int, Ref] = {}
        self._keep: List[Any] = list(inputs)  # ids stay unique while the trace runs
        self._inputs: List[Tensor] = list(inputs)
        for i, t in enumerate(inputs):
            self._refs.setdefault(id(t), Input(i))
        self._start: Dict[int, int] = {id(t): t._version for t in inputs}  # versions when first seen
        self._out_reads: List[Any] = []  # (node id, argument position, op value, its version then)
        # id(op value) -> the input or captured tensor whose memory it views (its version counter), as a Ref
        self._view_src: Dict[int, Ref] = {}
        # id(op value) -> the input or captured tensor it was copied from by a primitive that, for other strides,
        # may view it instead (a reshape of a transposed tensor)
        self._maybe_src: Dict[int, Ref] = {}
        self._prev: Any = None
        self._grad = True
        self.stopped: Optional[str] = None  # why the recording stopped ("at file:line, what"), or None
        self.read_grad_mode = False  # the function called is_grad_enabled() (guarded: function.py)
        self.grad_reads: List[Tuple[Tensor, Any]] = []  # (tensor, its .grad then) of each .grad read (tensor.py)
        self._prev_watch: Any = None
        self._on = False

    def note_grad(self, t: Tensor, value: Any) -> None:
        """``t.grad`` was read, its value then ``value`` (or set): by the traced code, not an op's own body
        (which runs with ``hook.tracer`` off, replayed whole)."""
        if hook.tracer is self:
            self.grad_reads.append((t, value))

    def note_grad_mode(self) -> None:
        """is_grad_enabled() was called: by the traced code (an op's own body runs with ``hook.tracer`` off)."""
        if hook.tracer is self:
            self.read_grad_mode = True

    def __enter__(self) -> "Tracer":
        self._grad = _grad_state.enabled  # a graph has one grad mode: the one its trace began in
        self._prev = hook.tracer
        hook.tracer = self
        self._prev_watch = _grad_state.watch
        self._on = True
        with _COUNT_LOCK:  # (read-modify-writes that threads tracing at once must not lose)
            _TRACING[0] += 1
            flag.value += 1
        _grad_state.watch = self
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._on:
            self._on = False
            with _COUNT_LOCK:
                flag.value -= 1
                _TRACING[0] -= 1
            hook.tracer = self._prev
            _grad_state.watch = self._prev_watch

    def stop(self, what: str) -> None:
        """Stop recording because of ``what`` (a value read, a write outside an op): the call goes on
        eagerly from here, and what was recorded is dropped. Each op already ran once, for real."""
        if self.stopped is None:
            self.stopped = f"{_user_site()}{what}"
        self.__exit__()
        self.graph.nodes = []
        self._refs = {}
        self._keep = []
        self._inputs = []
        self._out_reads = []
        self._view_src = {}
        self._maybe_src = {}

    def _viewed(self, src: Ref) -> Tensor:
        """The tensor of ``src``: an input, or a captured tensor."""
        return self._inputs[src.index] if isinstance(src, Input) else src.value

    def _source(self, a: Tensor) -> Optional[Ref]:
        """``a`` as an input or captured tensor, or the one whose memory it views; else None."""
        r = self._refs.get(id(a))
        if isinstance(r, Output):
            return self._view_src.get(id(a))
        return r if isinstance(r, Input) else Const(a)

    def _note_views(self, kind: str, args: Sequence[Any], outs: List[Any]) -> None:
        """Note each output of an op over the memory of an input or captured tensor: it shares the version
        counter of an argument that is one, or that views one (a slice of a slice, a reshape of a slice...).
        A primitive's copy of one that is not contiguous may be a view for other strides (a reshape)."""
        tensors = [a for a in args if isinstance(a, Tensor)]
        for o in outs:
            vc = o._vc
            src = None
            if vc is not UNWRITTEN:
                for a in tensors:
                    if a._vc is vc:
                        src = self._source(a)
                        if src is not None:
                            self._view_src[id(o)] = src
                            break
            if src is None and kind == "primitive" and len(tensors) == 1:
                a = tensors[0]
                flags = getattr(a._data, "flags", None)
                if flags is not None and not flags.c_contiguous and a._data.dtype == o._data.dtype:
                    src = self._source(a) or self._maybe_src.get(id(a))
                    if src is not None:
                        self._maybe_src[id(o)] = src

    def ref(self, x: Any) -> Ref:
        """The graph value for ``x``: a known tensor's reference, or a constant."""
        if isinstance(x, Tensor):
            r = self._refs.get(id(x))
            if r is not None:
                return r
        return Const(x)

    def call_op(self, kind: str, name: str, target: Any, args: Sequence[Any], attrs: Dict[str, Any]) -> Any:
        """Run ``target(*args, **attrs)`` with tracing paused, then record it as one node."""
        if _grad_state.enabled != self._grad:  # no_grad / enable_grad inside the traced function: each op
            self.stop("a change of grad mode (no_grad, enable_grad, set_grad_enabled) inside a traced "
                      "function")  # of the graph would be differentiated alike; it goes on eagerly
            return target(*args, **attrs)
        if kind == "cpp" and any(type(a) in (list, tuple) and any(isinstance(v, Tensor) for v in a) for a in args):
            # a C++ call (a module function, or an Apply bound some other way) taking a list of tensors:
            # each its own input, or the replay would read the traced tensors' values as a constant
            target, args = _flat_lists(name, target, args)
        # the arguments that are the call's inputs or captured tensors, with their versions: an op that
        # writes one in place (MarkDirty, an aot inplace input) is noted on the graph (``writes``)
        # (every tensor argument's version: a write into memory another tensor shares is ``view_writes``)
        held = [(k, a, a._version) for k, a in enumerate(args) if isinstance(a, Tensor)]
        nid = len(self.graph.nodes)
        for k, a, v in held:  # writes into an input or a captured tensor before this op read it
            if not isinstance(self._refs.get(id(a)), Output):
                d = v - self._start.setdefault(id(a), v)
                if d:
                    self.graph.arg_writes[(nid, k)] = d
            else:
                self._out_reads.append((nid, k, a, v))
                src = self._view_src.get(id(a)) if self._view_src else None
                if src is not None:  # a view of an input or captured tensor: its writes are that tensor's
                    t = self._viewed(src)
                    if t._vc is a._vc:
                        self.graph.view_reads[(nid, k)] = (src, v - self._start.get(id(t), v),
                                                           getattr(t._data, "strides", None), True)
                        src = None
                elif self._maybe_src:
                    src = self._maybe_src.get(id(a))
                    if src is not None:  # a copy here, a view for other strides
                        t = self._viewed(src)
                        tv = t._version
                        self.graph.view_reads[(nid, k)] = (src, tv - self._start.get(id(t), tv),
                                                           getattr(t._data, "strides", None), False)
        hook.tracer = None
        flag.value -= 1
        try:
            try:
                out = target(*args, **attrs)
            finally:
                flag.value += 1
                hook.tracer = self
        except BaseException:
            wrote = [k for k, a, v in held if a._version != v]
            if wrote:  # the write stays (as eagerly), but no node holds it: the call goes on eagerly
                self.stop(f"the C++ function {name} raised after writing its argument {wrote[0]} in place")
            raise
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for k, a, v in held:
            if a._version == v:
                continue
            ref = self._refs.get(id(a))
            if not isinstance(ref, Output):
                what = "an input" if isinstance(ref, Input) else "a captured tensor"
                self.graph.writes.append(f"{name} wrote {what} (its argument {k}) in place")
            elif kind == "cpp" and not any(a is o for o in outs):
                # an intermediate written (an inner Function's MarkDirty) and not returned: its later uses
                # read the write's history eagerly, which a replay of this node would not give them
                self.stop(f"the C++ function {name} wrote its argument {k}, a tensor of the trace, in place "
                          f"without returning it")
                return out
            shared = self._shares_memory(a)
            if shared is not None:
                self.graph.view_writes.append(f"{name} wrote its argument {k} in place, {shared}")
        if isinstance(out, (tuple, list)) and len(out) > 1:
            out = _distinct(out)
        self.record(kind, name, target, args, attrs, out)
        return out

    def call_bound(self, name: str, call: Optional[Any], args: Optional[Sequence[Any]]) -> Any:
        """A C++ module function's call (tracing.bound_hook): one node whose target is the whole function, so a
        replay runs what it does around its Functions' Applies; ``call`` None (its signature crosses values a
        graph cannot hold) stops the trace, and the function runs itself (``NotImplemented``)."""
        if call is None:
            if isinstance(args, str):  # why its def() cannot be replayed (keyword-only arguments)
                self.stop(f"the C++ function {name} {args}")
            else:
                self.stop(f"the C++ function {name} takes or returns a value a graph node cannot hold (only "
                          f"tensors, numbers, strings and lists of them in, tensors out)")
            return NotImplemented
        return self.call_op("cpp", name, call, args, {})

    def call_apply(self, name: str, replay: Any, args: Sequence[Any]) -> Any:
        """A C++ Function's Apply called by a function jit does not record whole (tracing.cpp_hook): bound by a
        class's def(), by a def() on a plain module object, by a pybind11 older than 3, or without a tensor
        in its signature. What that function does around Apply (an epilogue, a prologue, a Function picked
        by a value) would not be replayed, so the trace stops and the call goes on eagerly."""
        self.stop(f"the C++ Function {name} was applied by a function jit cannot record whole (a bound class's "
                  f"method, or a function bound by def() on a module object other than the m of OB_MODULE, "
                  f"NB_MODULE or PYBIND11_MODULE): a replay would not repeat its work around Apply; bind it "
                  f"with that m's def() to jit it (a helper in another source takes an opbuilder::ObModule)")
        return replay(*args)

    def _shares_memory(self, t: Tensor) -> Optional[str]:
        """How ``t``, just written in place, shares its memory with another tensor of the call, or None:
        it is a view (of a tensor of the trace or not), or another tensor of the trace counts writes on its
        version counter (a view of it made earlier, an op's output aliasing it). Eagerly such a write
        rebases the histories over that memory (runtime.call_rules.rebase_view)."""
        if t._base is not None:
            return "a view of another tensor"
        vc = t._vc
        for o in self._keep:
            if o is not t and isinstance(o, Tensor) and o._vc is vc:
                return "a tensor another tensor of the call views"
        return None

    def record(self, kind: str, name: str, target: Any, args: Sequence[Any], attrs: Dict[str, Any],
               out: Any) -> None:
        multi = isinstance(out, (tuple, list))
        outs = list(out) if multi else [out]
        for o in outs:
            if not isinstance(o, Tensor):
                if kind == "cpp":  # a C++ function's null TensorPtr (None): this call ran; the rest runs eagerly
                    self.stop(f"the C++ function {name} returned {type(o).__name__}, where a graph node holds "
                              f"tensors")
                    return
                raise TypeError(f"jit: op {name} returned a {type(o).__name__}; a traced op must return "
                                f"Tensors")
        self._note_views(kind, args, outs)
        shapes = [tuple(o._data.shape) for o in outs]
        if kind not in ("primitive", "backward"):  # a custom op, whose shapes may depend on its values: each
            target = _shape_checked(target, name, shapes, multi)  # replay checks them (a Backward's are checked)
        node = Node(id=len(self.graph.nodes), op=name, kind=kind, target=target,
                    inputs=[self.ref(a) for a in args], attrs=dict(attrs),
                    out_shapes=shapes, out_dtypes=[o._data.dtype for o in outs],
                    multi=multi)
        self.graph.nodes.append(node)
        for k, o in enumerate(outs):
            self._refs[id(o)] = Output(node.id, k)
            self._keep.append(o)
            if kind == "primitive":
                self._out_reads.append((node.id, -1 - k, o, o._version))

    def finish(self, outputs: Sequence[Any]) -> Graph:
        """Set the graph's outputs (the traced function's result tensors) and return the graph.

        An input an op wrote and returned as itself (MarkDirty, mark_dirty) is now that op's output:
        when the result does not hold it, it is one more output after the result's, so a call that
        records a gradient can give the caller's tensor the history of the write, as eagerly."""
        outs = [self.ref(o) for o in outputs]
        for i, t in enumerate(self._inputs):
            r = self._refs.get(id(t))
            if r is not None and r != Input(i) and r not in outs:
                outs.append(r)
        self.graph.outputs = outs
        self.graph.out_repeats = [(k, outs.index(r)) for k, r in enumerate(outs) if outs.index(r) != k]
        for k, o in enumerate(outputs):  # an output over an input's memory (the input, a view of it)
            if not isinstance(o, Tensor):
                continue
            # (of inputs on one counter, x and x.detach(): the one it is, else the one whose view it is)
            base = o._base_ref() if o._base_ref is not None else None
            over = [i for i, t in enumerate(self._inputs)  # (an op's output that is the input: one object)
                    if outs[k] == Input(i) or o is t or (o._vc is t._vc and o._vc is not UNWRITTEN)]
            viewed = [i for i in over if base is not None and base is (
                self._inputs[i]._base_ref() if self._inputs[i]._base_ref is not None else self._inputs[i])]
            if over:
                i = ([i for i in over if outs[k] == Input(i)] or viewed or over)[0]
                self.graph.out_alias.append((k, Input(i), o is self._inputs[i] or o._base_ref is not None))
            else:  # or over a captured tensor's (a view of a Parameter)
                src = self._view_src.get(id(o))
                if isinstance(src, Const) and src.value._vc is o._vc and isinstance(outs[k], Output):
                    self.graph.out_alias.append((k, src, o._base_ref is not None))
        for nid, k, a, v in self._out_reads:  # (k < 0: output -1 - k of a primitive as it made it)
            if a._version != v:
                if k < 0:
                    self.graph.stale_outs[(nid, -1 - k)] = (v, a._version)
                else:
                    self.graph.stale_reads[(nid, k)] = (v, a._version)
        self._out_reads = []
        self._keep = []
        self._inputs = []
        self._view_src = {}
        self._maybe_src = {}
        return self.graph


_RUNTIME_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class OutputShapeChanged(RuntimeError):
    """A replayed op (a C++ function, a Function, an aot op) returned other shapes than when traced: they
    depend on its input values, which a graph cannot follow (its later ops and its backward were built for
    the traced shapes). ``runtime.jit`` then runs the signature eagerly (jit/function.py)."""

    def __init__(self, op: str, traced: List[Any], got: List[Any]) -> None:
        super().__init__(f"{op} returned shapes {got} where its trace returned {traced}: its output shapes "
                         f"depend on its values, which a traced graph cannot follow")
        self.op = op


def _shape_checked(target: Any, name: str, shapes: List[Any], multi: bool) -> Any:
    """``target`` checking its results' shapes against the trace on every replay: a custom op's shapes
    are not a function of its input shapes alone (C++ x[x > 0]). A closure, as cheap as a Python frame
    can be; what the graph's passes read of a target (``name``, ``stops_gradient``) is copied onto it."""
    if not multi:
        shape = shapes[0]

        def run(*args: Any, **attrs: Any) -> Any:
            out = target(*args, **attrs)
            try:
                if out._data.shape == shape:
                    return out
            except AttributeError:  # (no tensor)
                pass
            raise OutputShapeChanged(name, shapes, _shapes_of([out]))
    else:
        def run(*args: Any, **attrs: Any) -> Any:
            out = target(*args, **attrs)
            got = _shapes_of(out)
            if got != shapes:
                raise OutputShapeChanged(name, shapes, got)
            return out
    for attr in ("name", "stops_gradient"):
        value = getattr(target, attr, None)
        if value is not None:
            setattr(run, attr, value)
    return run


def _shapes_of(outs: Any) -> List[Any]:
    return [tuple(o._data.shape) if isinstance(o, Tensor) else None for o in outs]


def _user_site() -> str:
    """'at file:line, ' of the innermost frame of the current stack outside the runtime, or ''."""
    f = sys._getframe(1)
    while f is not None:
        name = f.f_code.co_filename
        if not os.path.abspath(name).startswith(_RUNTIME_DIR + os.sep):
            return f"at {name}:{f.f_lineno}, "
        f = f.f_back
    return ""


def _flat_lists(name: str, call: Any, args: Sequence[Any]) -> Any:
    """``call`` and ``args`` with each list of tensors among ``args`` spread out, as arguments of their own (the
    trace tells tensors apart only as arguments: a list would be one constant), and a target that gathers
    them again for ``call``."""
    counts = [len(a) if type(a) in (list, tuple) and any(isinstance(v, Tensor) for v in a) else -1 for a in args]
    flat: List[Any] = []
    for a, n in zip(args, counts):
        if n < 0:
            flat.append(a)
        else:
            flat.extend(a)

    def gathered(*values: Any) -> Any:
        grouped, k = [], 0
        for n in counts:
            if n < 0:
                grouped.append(values[k])
                k += 1
            else:
                grouped.append(list(values[k:k + n]))
                k += n
        return call(*grouped)

    gathered.__qualname__ = name
    return gathered, flat


def _distinct(outs: Any) -> Any:
    """``outs`` with one tensor per position: a tensor an op returned at two positions is, after the first,
    a new tensor over the same memory, with the same history (the node output the one tensor is: eagerly
    the gradients of both positions reach it). The trace tells tensors apart by identity: one object would
    be one graph value, and the gradients of both positions would all reach the last one."""
    fresh: List[Any] = []
    for o in outs:
        dup = isinstance(o, Tensor) and any(o is p for p in fresh)
        if dup:  # the same memory and version counter, and the same history: a gradient of either position
            d = detached(o)  # reaches the node output the one tensor was (eagerly, one object: both reach it)
            if o._node is not None:
                d._node, d._out_index, d.requires_grad = o._node, o._out_index, o.requires_grad
            elif o.requires_grad:  # a leaf (an argument handed back twice): its gradient goes to the leaf
                d._node = ViewOfBase(o, np.arange(o._data.size).reshape(o._data.shape), (o._data.shape, o._data.dtype),
                                     (o._data.shape, o._data.dtype))
                d._out_index, d.requires_grad = 0, True
            o = d
        fresh.append(o)
    if all(o is p for o, p in zip(outs, fresh)):
        return outs
    return type(outs)(fresh) if type(outs) in (tuple, list) else type(outs)(*fresh)
