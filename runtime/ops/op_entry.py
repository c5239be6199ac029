"""The op-entry protocol: how every kind of op, and what a graph cannot hold, meets runtime.jit's tracer.

While a trace records on this thread (runtime/jit/tracing.py), an op call is handed to the tracer, which
runs it with the trace paused and records one graph node; otherwise the op just runs. The five op kinds
enter the same way:

- ``Primitive.call`` (primitive.py) inlines ``op_entry``'s check: it is the hottest path;
- ``ops.Custom.__call__``, ``autograd.Function.apply`` and ``nn.Cell.__call__`` are declared with
  ``@op_entry``;
- a C++ ``Function<T>::Apply`` reads ``flag`` through its address and calls ``jit.tracing.cpp_hook``
  (named to C++ by runtime/_native.py).

What a graph cannot hold (a value read into Python, an in-place write outside an op, a random draw, a
gradient taken inside the trace) is declared with ``@breaks_trace``: the trace stops there and the call
goes on eagerly (``jit.tracing.no_trace``).

A module declares; it never asks. Outside runtime/jit and runtime/graph only this module, primitive.py and
_native.py read the tracer (tests/test_tracer_hook.py scans the source for any other).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional, Union

from ..jit.tracing import flag as _flag
from ..jit.tracing import hook as _trace

__all__ = ["op_entry", "breaks_trace"]

_VARARGS, _VARKEYWORDS = 0x04, 0x08  # code flags (inspect.CO_VARARGS, CO_VARKEYWORDS; inspect not imported)


def op_entry(kind: str, name: Callable[[Any], Optional[str]],
             target: Optional[Callable[[Any], Callable[..., Any]]] = None) -> Callable[[Callable[..., Any]], Any]:
    """Declare ``call(op, args)`` (or ``call(op, args, kwargs)``), the eager call of an op of ``kind``
    (the graph node's kind), and return the entry ``op(*args, **kwargs)``, as ``Primitive.call`` takes
    its arguments: one tuple (and one dict), so the entry passes them on without repacking.

    No trace recording on this thread: ``call`` runs. While one records: ``name(op)`` is the node's name,
    and ``target(op)`` (default ``op`` itself) runs with the trace paused and is recorded as one node;
    when ``name(op)`` is None (a cell without ``bprop``) ``target(op)`` runs in the trace instead, its
    ops recorded one by one. The node's target is also what a replay calls."""
    def declare(call: Callable[..., Any]) -> Any:
        arity = call.__code__.co_argcount
        if arity == 2:  # call(op, args): no keywords
            def entry(op: Any, /, *args: Any) -> Any:
                if _flag.value and _trace.tracer is not None:
                    return _traced(kind, name, target, op, args, {})
                return call(op, args)
        elif arity == 3:  # call(op, args, kwargs)
            def entry(op: Any, /, *args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
                if _flag.value and _trace.tracer is not None:
                    return _traced(kind, name, target, op, args, kwargs)
                return call(op, args, kwargs)
        else:
            raise TypeError(f"op_entry: {call.__qualname__} must take (op, args) or (op, args, kwargs)")
        for attr in ("__module__", "__name__", "__qualname__", "__doc__"):  # not __wrapped__: its signature
            setattr(entry, attr, getattr(call, attr))                         # is the entry's, op(*args)
        entry.op_kind = kind  # type: ignore[attr-defined]
        return entry
    return declare


def unary_method(kind: str, stops_gradient: bool = False) -> Callable[[Callable[[Any], Any]], Any]:
    """Declare a one-argument Tensor method an op of the trace (``Tensor.detach``): ``fn(self)`` eagerly;
    while this thread's trace records, one node of ``kind`` whose input is ``self`` and whose target is
    ``fn``, so a replay runs it on that call's tensor. ``stops_gradient``: jit's backward sends no
    gradient through the node. One frame over ``fn``: no packing."""
    def declare(fn: Callable[[Any], Any]) -> Any:
        fn.stops_gradient = stops_gradient  # type: ignore[attr-defined]  # read by runtime/jit/backward.py

        def entry(self: Any) -> Any:
            if _flag.value and _trace.tracer is not None:
                return _trace.tracer.call_op(kind, kind, fn, (self,), {})
            return fn(self)
        for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
            setattr(entry, attr, getattr(fn, attr))
        entry.op_kind = kind  # type: ignore[attr-defined]
        return entry
    return declare


def _traced(kind: str, name: Callable[[Any], Optional[str]], target: Optional[Callable[[Any], Any]],
            op: Any, args: Any, kwargs: Any) -> Any:
    """An op entry's call while this thread's trace records (``op_entry``)."""
    fn = op if target is None else target(op)
    node = name(op)
    if node is None:
        return fn(*args, **kwargs)
    from ..tensor import Tensor as _Tensor
    if kwargs and any(isinstance(v, _Tensor) for v in kwargs.values()):
        # a tensor passed by keyword is an input of the node, not an attribute (a replay would reuse it)
        keys, n, call = tuple(kwargs), len(args), fn

        def fn(*a: Any) -> Any:
            return call(*a[:n], **dict(zip(keys, a[n:])))
        args, kwargs = tuple(args) + tuple(kwargs.values()), {}
    return _trace.tracer.call_op(kind, node, fn, args, kwargs)


def breaks_trace(what: Union[str, Callable[..., str]]) -> Callable[[Callable[..., Any]], Any]:
    """Declare that ``fn`` does what a graph cannot hold: ``what`` (or ``what(*args, **kwargs)`` of the
    call's arguments). While this thread's trace records, a call first stops it (the graph would keep a
    traced value, or miss a write): the call, and the rest of the traced function, go on eagerly, and
    that signature runs eagerly from then on (runtime/jit/function.py). Nothing runs twice."""
    def declare(fn: Callable[..., Any]) -> Any:
        code = getattr(fn, "__code__", None)
        fixed = (isinstance(what, str) and code is not None and not getattr(fn, "__defaults__", None)
                 and not code.co_kwonlyargcount and not code.co_flags & (_VARARGS | _VARKEYWORDS))
        if fixed and code.co_argcount == 1:  # a read of one tensor's value: no packing per call
            def entry(a: Any) -> Any:
                if _flag.value and _trace.tracer is not None:
                    _trace.tracer.stop(what)
                return fn(a)
        elif fixed and code.co_argcount == 2:
            def entry(a: Any, b: Any) -> Any:  # type: ignore[misc]
                if _flag.value and _trace.tracer is not None:
                    _trace.tracer.stop(what)
                return fn(a, b)
        elif isinstance(what, str):
            def entry(*args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
                if _flag.value and _trace.tracer is not None:
                    _trace.tracer.stop(what)
                return fn(*args, **kwargs)
        else:
            def entry(*args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
                if _flag.value and _trace.tracer is not None:
                    _trace.tracer.stop(what(*args, **kwargs))
                return fn(*args, **kwargs)
        return functools.update_wrapper(entry, fn)
    return declare
