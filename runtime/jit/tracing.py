"""The switch that ops check to know whether a trace is being recorded.

Python asks through one op-entry protocol, runtime/ops/op_entry.py (``@op_entry``
declares an op kind's entry, ``@breaks_trace`` what stops a trace; ``Primitive.call``
inlines its check); C++ ``Function<T>::Apply`` reads the int behind ``flag``
(through its address, see include/opbuilder/detail/runtime_bridge.h), which is
non-zero while any thread traces, so Python reads it before ``hook.tracer``.
When a trace is active the op hands itself to the tracer, which runs it with
tracing off and records one graph node. Dependency-free (stdlib only) so the
C++ side can import it cheaply.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable, Optional, Tuple, Union

__all__ = ["hook", "flag", "watchers", "flag_address", "cpp_hook", "bound_hook", "TraceBreak", "no_trace"]


class _Hook(threading.local):
    tracer: Any = None  # the active runtime.jit.capture.Tracer of this thread, or None


hook = _Hook()
# Non-zero while any thread traces; C++ ops then call cpp_hook, which checks the thread.
flag = ctypes.c_int(0)
# Tracers that want to hear of a C++ Apply made on a thread with no tracer while they run (to_jax's probe:
# an XLA FFI handler runs and records its own thread's Applies only), by ``other_thread(name)``.
watchers: set = set()


class TraceBreak(BaseException):
    """Kept for code that imported it; nothing raises it any more. A trace that meets what a graph
    cannot hold stops recording and the call goes on eagerly (``no_trace``), so no op runs twice."""


def no_trace(what: str) -> None:
    """Stop the trace of this thread, if one is recording, because of ``what``: a tensor's value turned
    into a Python value (``bool(t)``, ``t.item()``: the graph would keep the traced value) or a tensor
    written in place outside an op (``t[i] = v``, ``t += 1``, ``ops.assign``: the graph would not
    write it). Nothing is raised: the trace runs the call eagerly (its ops ran for real as they were
    recorded), so the rest of the call simply runs with the trace off and its result is the call's
    result; the signature then runs eagerly (function.py). No op or Python statement runs twice, and
    a user's ``try``/``except`` around the code sees nothing."""
    tracer = hook.tracer
    if tracer is not None:
        tracer.stop(what)


def flag_address() -> int:
    """The address of ``flag`` (read by C++ ``Function<T>::Apply``)."""
    return ctypes.addressof(flag)


def cpp_hook(name: str, replay: Callable[..., Any], args: Tuple[Any, ...]) -> Any:
    """Called by a C++ ``Function<T>::Apply`` while ``flag`` is set: hand it to this thread's tracer, or just
    run it. A jit trace meets an Apply here only outside a module function it records whole (bound_hook),
    and stops (``call_apply``); a tracer that records Applies (to_jax's probe) records it."""
    tracer = hook.tracer
    if tracer is None:
        for w in tuple(watchers):
            w.other_thread(name)
        return replay(*args)
    record = getattr(tracer, "call_apply", None)
    if record is not None:
        return record(name, replay, args)
    return tracer.call_op("cpp", name, replay, args, {})


def bound_hook(name: str, call: Optional[Callable[..., Any]], args: Union[Tuple[Any, ...], str, None],
               ffi: Any = None) -> Any:
    """Called by a C++ module function (OB_MODULE's ``m.def``, include/opbuilder/detail/bound_call.h) while
    ``flag`` is set. With this thread's trace recording, the whole call is one node whose target is ``call``
    (the module's function object: replayed with no trace recording, it runs itself), so a replay runs what the function does besides its Functions' Applies (an
    epilogue, a prologue, a Function picked by a value); ``call`` None (a signature the graph cannot hold)
    stops the trace. ``NotImplemented``: the function runs itself (no trace on this thread, or a tracer
    that records Applies, as to_jax's probe). ``ffi``: the function's XLA FFI entry (a capsule, or None;
    include/opbuilder/detail/ffi_bound.h), for a tracer that takes it (``call_bound_ffi``: to_jax's probe)."""
    tracer = hook.tracer
    probe = getattr(tracer, "call_bound_ffi", None)
    if probe is not None and call is not None:
        return probe(name, call, args, ffi)
    record = getattr(tracer, "call_bound", None)
    if record is None:
        return NotImplemented
    return record(name, call, args)
