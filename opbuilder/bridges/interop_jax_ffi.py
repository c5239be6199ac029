"""``to_jax``'s XLA FFI path: a module function runs as an XLA custom call (``jax.ffi.ffi_call``)
instead of a host callback: no GIL, no Python per call.

Two kinds of handlers:
- generic (the default): ``generic_targets`` builds src/jax_ffi.cpp once per JAX version through the
  builder (cached like any operator) and registers its forward and backward targets once. They run the
  module function itself, whole, in C++, on every call (include/opbuilder/detail/xla_ffi_handlers.h
  BoundHandlers): a C++ function of tensors bound in opbuilder's module (detail/bound_call.h) has an
  FfiBoundEntry (detail/ffi_bound.h), which a call names by its ``entry`` attribute. So the Function a
  function picks by the call's values, and work it does around Apply, is what eager runs. While it
  runs, each Function<T>::Apply hands its call to the handler, which runs Forward with a context it
  owns. ``probe_entry`` finds the entry once per signature: it calls the function on zeros with a
  probe as runtime.jit's trace hook, which the function's call reaches with its entry
  (runtime/jit/tracing.py bound_hook). A Python function around it takes the host route (it could pick
  by a value where no handler sees it). So no operator needs XLA's headers or a line of its own.
- per module: a Function bound with ``OB_XLA_FFI`` (the PyCapsules ``<name>_xla_fwd`` /
  ``<name>_xla_bwd``, include/opbuilder/xla_ffi.h) uses its module's (``ffi_targets``): that Function
  alone.
- host: a call neither can take (a Python function, static arguments, a Function using saved_data) runs
  to_jax's callback code as the generic module's ``host`` target (``host_call``), with the GIL,
  instead of through jax.pure_callback.

The generic backward does not run the function again: the forward JAX differentiates records a tape
(each Apply's context and Backward, and which values its arguments and outputs are), keeps it in the
handlers' bounded table and returns a token naming it (one more result); the backward takes the token
and runs the tape (``ffi_function``'s ``bound``). A backward whose tape is gone runs the function again.

XLA's buffers are never written: the generic handlers lend the function its inputs, and code that
touches one gets a writable private copy first (an in-place op, MarkDirty or not, or a write before
Apply, lands in a copy, as on the callback path); a ``kConstArgs`` Function reads XLA's memory itself,
read-only. OB_XLA_FFI's handlers give a ``kAcceptsViews`` type known to write nothing XLA's memory
itself, read-only. Result shapes come from the shape rule (``<name>_infer_shape`` or ``shape_fn``) or, on the
generic path, from the probe run. Complex gradients follow JAX's convention on both paths: the
handlers compute the runtime's (torch's), and the cotangents in and the gradients out are conjugated
(``runtime_cotangent``, ``jax_gradient``). The backward asks for the gradients of the inputs JAX
differentiates only (``Needs``, the ``needs`` attribute). The entry address is process-local and part of the
lowered program, so JAX's persistent compilation cache keys it: another process (another address)
compiles its own.
"""
from __future__ import annotations

import ctypes
import itertools
import threading
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from runtime.call_rules import double_backward_message as _double_backward_message
from runtime.call_rules import to_framework_cotangent as _to_framework_cotangent
from runtime.jit import tracing as _tracing

__all__ = ["probe_values", "FFI_FWD", "FFI_BWD", "ffi_targets", "ffi_function", "runtime_cotangent", "jax_gradient",
           "jax_dtype", "generic_targets", "probe_entry", "host_call", "Needs", "primal_values", "dense_cotangent",
           "masked_targets", "FFI_NEEDS"]

FFI_FWD, FFI_BWD = "_xla_fwd", "_xla_bwd"
FFI_NEEDS = "_xla_needs"  # set by OB_XLA_FFI where the backward handler takes the `needs` attribute

_registered: "weakref.WeakKeyDictionary[Any, Dict[str, Tuple[str, str]]]" = weakref.WeakKeyDictionary()
_serial = itertools.count()


def ffi_targets(module: Any, funcs: Dict[str, Callable], shape_fns: Dict[str, Callable]) -> Dict[str, Tuple[str, str]]:
    """The XLA target names (forward, backward) of ``module``'s functions that have FFI handlers;
    each is registered with XLA once per module object. ValueError for one without a shape rule.
    ``masked_targets`` says which backward handlers take the ``needs`` attribute."""
    with_handlers = [n for n in funcs if hasattr(module, n + FFI_FWD) and hasattr(module, n + FFI_BWD)]
    for name in with_handlers:
        if name not in shape_fns:
            raise ValueError(f"to_jax: {name} has XLA FFI handlers ({name}{FFI_FWD}) but no shape rule: the "
                             f"custom call needs its result shapes before it runs; declare a static InferShape "
                             f"in the Function and bind it as '{name}_infer_shape' "
                             f"(m.def(\"{name}_infer_shape\", T::InferShapeFunction())), or pass "
                             f"shape_fn={{'{name}': ...}}")
    try:
        done = _registered.setdefault(module, {})
    except TypeError:  # not weak-referenceable: register for this call only
        done = {}
    for name in with_handlers:
        if name not in done:
            prefix = f"opbuilder.{getattr(module, '__name__', 'module')}.{next(_serial)}.{name}"
            jax.ffi.register_ffi_target(prefix + ".fwd", getattr(module, name + FFI_FWD), platform="cpu")
            jax.ffi.register_ffi_target(prefix + ".bwd", getattr(module, name + FFI_BWD), platform="cpu")
            done[name] = (prefix + ".fwd", prefix + ".bwd")
    return {name: done[name] for name in with_handlers}


def masked_targets(module: Any, name: str) -> bool:
    """Whether ``module``'s OB_XLA_FFI backward handler of ``name`` takes the ``needs`` attribute (a
    module built with older headers does not: it computes every gradient)."""
    return bool(getattr(module, name + FFI_NEEDS, False))


# ---- the generic handlers: one pair for every Function (src/jax_ffi.cpp) ----------------------------

# detail/replay.h's kReplayAbi: the replay target layout this module reads
_REPLAY_ABI = 0x0b0ffe9100000003
_generic_lock = threading.Lock()
_generic: Dict[str, Any] = {}  # "targets": (forward, backward) names, or "error": why they are missing


def generic_targets() -> Tuple[Optional[Tuple[str, str, str]], Optional[str]]:
    """The XLA target names (forward, backward, host) of to_jax's generic handlers, built on first use (once
    per JAX version, through the builder and its cache: src/jax_ffi.cpp against jax.ffi.include_dir())
    and registered once; or (None, why) when they cannot be built."""
    with _generic_lock:
        if "targets" not in _generic and "error" not in _generic:
            try:
                from .. import CustomOpBuilder
                from ..native.headers import source_dir
                tag = "".join(c if c.isalnum() else "_" for c in jax.__version__)
                mod = CustomOpBuilder(f"_opbuilder_jax_ffi_{tag}", [str(source_dir() / "jax_ffi.cpp")],
                                      include_paths=[jax.ffi.include_dir()]).load()
                names = ("opbuilder.ffi.bound_forward", "opbuilder.ffi.bound_backward", "opbuilder.ffi.host")
                for name, cap in zip(names, (mod.bound_forward, mod.bound_backward, mod.host)):
                    jax.ffi.register_ffi_target(name, cap, platform="cpu")
                _generic["module"] = mod  # keeps the handlers' library loaded
                _generic["targets"] = names
            except Exception as e:  # a missing compiler or XLA headers: every call takes the callback
                _generic["error"] = f"to_jax's XLA FFI handlers could not be built ({type(e).__name__}: {e})"
    return _generic.get("targets"), _generic.get("error")


# what the probe's run of a Function names as where it runs, in saved_data's refusal (binding.h)
_PROBE_WHERE = ctypes.c_char_p(b"to_jax's probe of its XLA FFI route")
_NO_PYTHON = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
_NEEDS_PYTHON = "ctx->saved_data holds Python objects"


class _Probe:
    """runtime.jit's tracer protocol (runtime/jit/tracing.py ``hook.tracer``), recording the ops one
    module function call runs: each runs as it would untraced, with the trace paused. A C++ Function
    runs with its module's probe mark set (its ctx->saved_data refuses): a Forward that uses saved_data
    is noted (``needs_python``, for the host route) and run again without the mark. With ``fake`` (the shape rule's specs and
    whether the op returns one tensor) a Function does not run: it returns zeros of those specs."""

    stopped: Optional[str] = None

    def __init__(self, fake: Optional[Tuple[Sequence[Any], bool]] = None) -> None:
        self.calls: List[Tuple[str, str, Any, Tuple[Any, ...], Any]] = []
        self.fake = fake
        self.needs_python: Optional[str] = None
        self.needs_python_name = ""  # the Function that needs it
        self.seen: List[List[Any]] = []  # per op: the values of its arguments as it was called
        self.threads: List[str] = []  # Functions applied on other threads while the probe ran

    def other_thread(self, name: str) -> None:
        """runtime.jit.tracing's watchers protocol: a C++ Apply of ``name`` on a thread without a tracer."""
        self.threads.append(name)

    def stop(self, what: str) -> None:
        self.calls.append(("stop", what, None, (), None))

    def call_op(self, kind: str, name: str, target: Any, args: Sequence[Any], attrs: Dict[str, Any]) -> Any:
        self.seen.append([np.array(np.asarray(a._data)) if hasattr(a, "_data") else None for a in args])
        _tracing.hook.tracer = None
        _tracing.flag.value -= 1
        try:
            out = self._run(kind, target, args, attrs)
            if self.needs_python is not None and not self.needs_python_name:
                self.needs_python_name = name
        finally:
            _tracing.flag.value += 1
            _tracing.hook.tracer = self
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        values = [np.array(np.asarray(o._data)) if hasattr(o, "_data") else None for o in outs]
        self.calls.append((kind, name, target, tuple(args), (out, values)))
        return out

    def _run(self, kind: str, target: Any, args: Sequence[Any], attrs: Dict[str, Any]) -> Any:
        swap = _no_python_of(target, len(args)) if kind == "cpp" else None
        if swap is None:
            return target(*args, **attrs)
        if self.fake is not None:
            from runtime.tensor import Tensor
            specs, single = self.fake
            outs = [Tensor._from_array(probe_values(tuple(s.shape), np.dtype(s.dtype), 2)) for s in specs]
            return outs[0] if single else outs
        no_python = _NO_PYTHON(swap)
        old = no_python(ctypes.cast(_PROBE_WHERE, ctypes.c_void_p))
        try:
            return target(*args, **attrs)
        except Exception as e:
            if _NEEDS_PYTHON not in str(e):
                raise
            self.needs_python = str(e)
        finally:
            no_python(old)
        return target(*args, **attrs)




class _BoundProbe(_Probe):
    """A _Probe that also sees C++ module functions (OB_MODULE's m.def, detail/bound_call.h): each call
    runs itself, its Applies seen by a _Probe of their own (``needs_python``), and is noted with its
    XLA FFI entry (a capsule, or None for a signature that has one argument that is not a tensor)."""

    def call_bound_ffi(self, name: str, call: Callable, args: Tuple[Any, ...], ffi: Any) -> Any:
        inner = _Probe(self.fake)
        prev = _tracing.hook.tracer
        _tracing.hook.tracer = inner
        try:
            out = call(*args)
        finally:
            _tracing.hook.tracer = prev
        if self.needs_python is None and inner.needs_python is not None:
            self.needs_python, self.needs_python_name = inner.needs_python, inner.needs_python_name
        self.seen.append([np.array(np.asarray(a._data)) if hasattr(a, "_data") else None for a in args])
        self.calls.append(("bound", name, (call, ffi), tuple(args), out))
        return out


def _pointer(a: Any) -> Tuple[int, Tuple[int, ...]]:
    d = np.asarray(a._data if hasattr(a, "_data") else a)
    return d.__array_interface__["data"][0], d.shape


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _no_python_of(replay: Any, nargs: int) -> Optional[int]:
    """The address of the module's SwapNoPython that runtime.jit's replay target of a C++ Function
    carries (detail/replay.h), or None for a replay that is not opbuilder's or of another version."""
    cap = getattr(replay, "__self__", None)
    if type(cap).__name__ != "PyCapsule":
        return None
    try:
        target = _capsule_pointer(cap, b"opbuilder.replay")
    except ValueError:
        return None
    if (ctypes.c_uint64.from_address(target + 16).value != _REPLAY_ABI
            or ctypes.c_ssize_t.from_address(target + 8).value != nargs):
        return None
    return ctypes.c_void_p.from_address(target + 24).value or None


def probe_values(shape: Tuple[int, ...], dtype: np.dtype, pattern: int) -> np.ndarray:
    """Values of ``shape`` and ``dtype`` for a probe run (``probe_entry``): non-zero and varied, so work
    done outside a Function's Apply changes what it returns; pattern 0 positive, 1 negative (for
    unsigned and bool types, other values), 2 for a shape rule's stand-in outputs; 3 zeros. For output
    shapes when a run on zeros raises (interop_jax ``_probe``): 4 halves (ones for integers), 5 the identity
    over the last two dimensions (halves unless they are square)."""
    if pattern == 3:
        return np.zeros(shape, dtype)
    if pattern in (4, 5):
        v = np.full(shape, 0.5 if dtype.kind in "fc" else 1, dtype)
        if pattern == 5 and len(shape) >= 2 and shape[-1] == shape[-2]:
            v = np.broadcast_to(np.eye(shape[-1], dtype=dtype), shape).copy()
        return v
    n = int(np.prod(shape, dtype=np.int64))
    k = np.arange(n, dtype=np.int64)
    if dtype.kind == "b":
        v = (k + pattern) % 2 == 0
    elif dtype.kind in "iu":
        v = (1 + (k + 3 * pattern) % 5) * (-1 if pattern == 1 and dtype.kind == "i" else 1)
    else:
        v = (0.75 + 0.5 * ((k + pattern) % 7)) * (-1.0 if pattern == 1 else 1.0)
        if dtype.kind == "c":
            v = v + 0.25j * (1 + k % 3)
    return np.asarray(v).astype(dtype).reshape(shape)


def probe_entry(fn: Callable, run: Callable[[int], Tuple[Sequence[Any], Sequence[Any]]],
                fake: Optional[Tuple[Sequence[Any], bool]] = None) -> Tuple[Optional[int], Optional[str]]:
    """The FfiBoundEntry (include/opbuilder/detail/ffi_bound.h) of the C++ module function ``fn`` is,
    or (None, why). ``run(k)`` calls ``fn`` once (at trace time) on ``probe_values(..., k)`` of the
    arguments' shapes and returns (its runtime Tensor arguments, its outputs); it is called once, on
    zeros. The generic handlers run that function whole, in C++, on every call: a Function it picks
    by a value is picked by the call's values. So ``fn`` must be the module's C++ function itself (a
    Python function around it could pick by a value where no handler sees it), every argument a tensor.
    ``fake``: the shape rule's output specs and single flag, so its Functions need not run (_Probe)."""
    probe = _BoundProbe(fake)
    prev = _tracing.hook.tracer
    _tracing.hook.tracer = probe
    _tracing.watchers.add(probe)
    _tracing.flag.value += 1
    try:
        args, outs = run(3)
    except Exception as e:
        return None, f"its call on zeros of the arguments' shapes raised {type(e).__name__}: {e}"
    finally:
        _tracing.flag.value -= 1
        _tracing.watchers.discard(probe)
        _tracing.hook.tracer = prev
    if len(probe.calls) != 1 or probe.calls[0][0] != "bound":
        kinds = ", ".join(f"{k} {n}" for k, n, *_ in probe.calls) or "no op"
        return None, f"it is not one C++ module function (it ran {kinds})"
    _, name, (call, ffi), cargs, _ = probe.calls[0]
    if call is not fn:
        return None, (f"it is a Python function over the C++ function {name}, which could pick what it runs "
                      f"by a value; pass the module's function itself")
    if ffi is None:
        return None, f"the C++ function {name} takes or returns values that are not tensors (XLA passes buffers only)"
    try:
        same_in = len(cargs) == len(args) and all(_pointer(a) == _pointer(b) for a, b in zip(cargs, args))
    except Exception:  # not tensors
        same_in = False
    if not same_in:
        return None, f"it does not pass its arrays, in order, to the C++ function {name}"
    if probe.threads:
        return None, (f"its C++ function runs {probe.threads[0]} on another thread, whose Applies no XLA FFI "
                      f"handler records")
    if probe.needs_python is not None:
        return None, (f"its C++ Function {probe.needs_python_name} uses ctx->saved_data, which holds Python "
                      f"objects; the custom call runs without Python")
    try:
        entry = _capsule_pointer(ffi, b"opbuilder.ffi_bound")
    except ValueError:
        return None, f"the C++ function {name} has no XLA FFI entry of this opbuilder version; rebuild it"
    if (ctypes.c_uint64.from_address(entry).value != _BOUND_ABI
            or ctypes.c_size_t.from_address(entry + 8).value != len(args)):
        return None, f"the C++ function {name} was built by another opbuilder version (no XLA FFI entry); rebuild it"
    return entry, None


# detail/ffi_bound.h's kFfiBoundAbi: the bound entry layout this module reads
_BOUND_ABI = 0x0b0ffb0000000004


def host_call(target: str, keep: Dict[Any, Callable]) -> Callable:
    """``call(key, cb, structs, *arrays)``: ``cb`` (to_jax's callback code, numpy in and out) as the XLA
    custom call ``target`` (the generic module's ``host``): it runs ``cb`` with the GIL on XLA's buffers,
    as jax.pure_callback does, without JAX's callback machinery per call. ``keep`` holds the bodies the
    lowered programs name (by address), one per ``key`` and shapes."""
    def call(key: Any, cb: Callable, structs: Sequence[Any], *arrays: Any) -> Any:
        ins = tuple((tuple(np.shape(a)), np.dtype(a.dtype)) for a in arrays)
        outs = tuple((tuple(s.shape), np.dtype(s.dtype)) for s in structs)
        body = keep.get((key, ins, outs))
        if body is None:
            def body(in_views: Tuple[memoryview, ...], out_views: Tuple[memoryview, ...]) -> None:
                # a float0 cotangent (an integer output's) has no bytes to read: zeros, as pure_callback gives
                res = cb(*[np.frombuffer(m, d).reshape(s) if d.itemsize else np.zeros(s, d)
                           for m, (s, d) in zip(in_views, ins)])
                for j, (m, r, (s, d)) in enumerate(zip(out_views, res, outs)):
                    r = np.asarray(r)
                    if r.shape != s or r.dtype != d:
                        raise RuntimeError(f"result {j} has shape {r.shape} and dtype {r.dtype}, but XLA expects "
                                           f"shape {s} and dtype {d}")
                    np.frombuffer(m, d).reshape(s)[...] = r
            keep[(key, ins, outs)] = body
        return jax.ffi.ffi_call(target, tuple(structs), vmap_method="sequential")(*arrays, fn=np.int64(id(body)))
    return call


def runtime_cotangent(ct: Any) -> Any:
    """JAX's cotangent as the runtime's grad_output. The conventions are runtime.call_rules'
    (COMPLEX_GRADIENT): the runtime's complex gradients are torch's, the conjugate of JAX's, so a
    complex cotangent is conjugated. Works on numpy arrays and on JAX arrays inside a trace."""
    return _to_framework_cotangent(ct, "jax")  # conjugation is its own inverse: JAX -> runtime too


def jax_gradient(g: Any) -> Any:
    """The runtime's (torch's) gradient as JAX's (runtime.call_rules' to_framework_cotangent)."""
    return _to_framework_cotangent(g, "jax")


def jax_dtype(dtype: Any) -> np.dtype:
    """The dtype a JAX array of ``dtype`` gets: its 32-bit twin while ``jax_enable_x64`` is off, as jnp
    gives (int64 -> int32, float64 -> float32, complex128 -> complex64)."""
    return np.dtype(jax.dtypes.canonicalize_dtype(dtype))


def _aliases(name: str, positions: Tuple[int, ...], writes: Tuple[int, ...], arrays: Sequence[Any],
             structs: Sequence[jax.ShapeDtypeStruct]) -> Dict[int, int]:
    """input_output_aliases for the arguments ``writes`` (positions, declared by to_jax's ``mutates``):
    each to the first free output of its shape and dtype, which an in-place op returns it as."""
    out: Dict[int, int] = {}
    for k in writes:
        i = positions.index(k)
        shape, dtype = tuple(np.shape(arrays[i])), np.dtype(arrays[i].dtype)
        j = next((j for j, s in enumerate(structs)
                  if j not in out.values() and tuple(s.shape) == shape and np.dtype(s.dtype) == dtype), None)
        if j is None:
            raise ValueError(f"{name}: mutates names argument {k} (shape {shape}, {dtype}), but no output has its "
                             f"shape and dtype; JAX arrays are immutable, so a function that writes an argument "
                             f"must return it (an in-place op) for JAX to see the write")
        out[i] = j
    return out


class Needs:
    """Which inputs JAX differentiates (custom_vjp's ``perturbed``), carried from the forward rule to
    the backward one as static residual data: the backward computes only those gradients."""

    def __init__(self, flags: Sequence[bool]) -> None:
        self.flags = tuple(bool(f) for f in flags)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Needs) and other.flags == self.flags

    def __hash__(self) -> int:
        return hash(self.flags)

    def mask(self) -> np.int64:
        """The flags as the generic backward handler's ``needs`` attribute: bit i for input i (an input
        past the 64th always gets its gradient)."""
        v = sum(1 << i for i, f in enumerate(self.flags[:64]) if f)
        return np.int64(v - (1 << 64) if v >= 1 << 63 else v)  # as a signed 64-bit value


# a pytree with no leaves: the flags are its static data (jax.tree_util.register_static is newer than 0.4.34)
jax.tree_util.register_pytree_node(Needs, lambda n: ((), n.flags), lambda flags, _: Needs(flags))


def once_differentiable(name: str, backward: Callable) -> Callable:
    """``backward`` (arrays in, arrays out: a backward rule's custom call or callback) with the runtime's
    one error for a gradient of a gradient, raised when JAX differentiates it (``jax.grad`` of
    ``jax.grad``, ``jax.jacrev`` of it), as eager and torch raise it; JAX's own errors differed by route.
    (Forward mode over the op, as in ``jax.hessian``, is JAX's custom_vjp error, or this one where the
    taped forward is met first.)"""
    g = jax.custom_jvp(backward)

    def refuse(primals, tangents):
        raise RuntimeError(_double_backward_message(name))

    g.defjvp(refuse)
    return g


def primal_values(args: Sequence[Any]) -> Tuple[Tuple[Any, ...], Needs]:
    """A ``symbolic_zeros`` forward rule's arguments (CustomVJPPrimal) as (values, which are perturbed)."""
    return tuple(a.value for a in args), Needs(a.perturbed for a in args)


def dense_cotangent(ct: Any, shape: Any, dtype: Any) -> Any:
    """A cotangent JAX gives a ``symbolic_zeros`` backward rule (a SymbolicZero for an unused output,
    float0 for an integer one) as an array of the output's shape and dtype."""
    if isinstance(ct, jax.custom_derivatives.SymbolicZero) or getattr(ct, "dtype", None) == jax.dtypes.float0:
        return jnp.zeros(shape, dtype)
    return ct


def ffi_function(op: Any, positions: Tuple[int, ...], targets: Tuple[str, str],
                 writes: Tuple[int, ...] = (), attrs: Optional[Dict[str, Any]] = None,
                 masked: bool = False, bound: bool = False) -> Callable:
    """A ``custom_vjp`` over the XLA custom calls ``targets`` (forward, backward) for an all-array call
    of ``op`` (to_jax's ``_JaxOp``: its ``specs`` gives the result shapes). The arguments at positions
    ``writes`` are declared to XLA as aliased to an output: XLA copies each into that result buffer (or
    uses a donated one), and the handler gives Forward that buffer to write. ``attrs``: the custom
    calls' attributes (the generic handlers' ``entry``). The backward computes gradients only for the
    inputs JAX differentiates (``Needs``): with ``masked`` (the generic backward handler, which takes
    the ``needs`` attribute) it returns only those; an OB_XLA_FFI module's handler returns all, and the
    others are dropped.

    ``bound``: the targets are the generic handlers of a whole module function (``entry``: its
    FfiBoundEntry). The forward JAX differentiates returns one more result, a token naming the tape of
    its Applies (what each Forward saved) that the handler keeps; the backward takes it and runs those
    Backwards without running the function again (it does, for a tape no longer kept)."""
    fwd_target, bwd_target = targets
    attrs = attrs or {}

    def out_structs(arrays):
        specs, single = op.specs(positions, (), arrays)
        return tuple(_struct(s.shape, s.dtype, arrays) for s in specs), single

    def forward(arrays, needs=None):
        structs, single = out_structs(arrays)
        aliases = _aliases(op.name, positions, writes, arrays, structs) if writes else {}
        extra = {}
        if bound:
            extra = {"needs": needs.mask() if needs is not None else np.int64(0),
                     "record": np.int64(needs is not None)}
        if needs is not None:  # the token: 8 bytes, as 2 uint32 (int64 needs x64)
            structs = structs + (_struct((2,), np.uint32, arrays),)
        outs = jax.ffi.ffi_call(fwd_target, structs, vmap_method="sequential",
                                input_output_aliases=aliases or None)(*arrays, **attrs, **extra)
        token = outs[-1] if needs is not None else None
        outs = outs[:-1] if needs is not None else outs
        return (outs[0] if single else tuple(outs)), token

    @jax.custom_vjp
    def f(*arrays):
        return forward(arrays)[0]

    def f_fwd(*args):
        arrays, needs = primal_values(args)
        small = sum(np.prod(np.shape(a), dtype=np.int64) * np.dtype(a.dtype).itemsize for a in arrays) < _TAPE_FROM
        if not bound or not any(needs.flags) or small:  # (small: running the function again costs less)
            return f(*arrays), (arrays, needs, None)
        out, token = once_differentiable(op.name, lambda *a: forward(a, needs))(*arrays)  # (the tape's forward)
        return out, (arrays, needs, token)

    def f_bwd(res, ct):
        arrays, needs, token = res
        if bound:
            return _bound_backward(arrays, needs, token, ct)
        structs, _ = out_structs(arrays)
        cts = (ct,) if not isinstance(ct, tuple) else ct
        cts = tuple(runtime_cotangent(dense_cotangent(c, s.shape, s.dtype)) for c, s in zip(cts, structs))
        # the gradients the call returns: the differentiated inputs' (masked), else every input's
        wanted = [i for i in range(len(arrays)) if needs.flags[i] or not masked or i >= 64]
        if not wanted and not writes:  # nothing differentiated (JAX does not call it so; kept safe)
            return (None,) * len(arrays)
        # an input Forward writes (declared) gets a scratch result aliased to it: XLA copies it there
        written = [positions.index(k) for k in writes]
        scratch = tuple(_struct(np.shape(arrays[i]), arrays[i].dtype, arrays) for i in written)
        extra = {"needs": needs.mask()} if masked else {}
        call = jax.ffi.ffi_call(bwd_target, tuple(_struct(np.shape(arrays[i]), arrays[i].dtype, arrays)
                                                  for i in wanted) + scratch, vmap_method="sequential",
                                input_output_aliases={i: len(wanted) + m for m, i in enumerate(written)} or None)
        got = once_differentiable(op.name, lambda *xs: call(*xs, **attrs, **extra))(*arrays, *cts)[:len(wanted)]
        grads: List[Any] = [None] * len(arrays)
        for i, g in zip(wanted, got):
            if needs.flags[i] and jnp.issubdtype(arrays[i].dtype, jnp.inexact):
                grads[i] = jax_gradient(g)
        return tuple(grads)

    def _bound_backward(arrays, needs, token, ct):
        structs, _ = out_structs(arrays)
        cts = (ct,) if not isinstance(ct, tuple) else ct
        cts = tuple(runtime_cotangent(dense_cotangent(c, s.shape, s.dtype)) for c, s in zip(cts, structs))
        wanted = [i for i in range(len(arrays)) if needs.flags[i] or i >= 64]
        if not wanted:
            return (None,) * len(arrays)
        if token is None:  # none recorded: the handler runs the function again
            token = _vary_alike(tuple(arrays) + (jnp.zeros((2,), np.uint32),))[-1]  # (shard_map: typed alike)
        call = jax.ffi.ffi_call(bwd_target, tuple(_struct(np.shape(arrays[i]), arrays[i].dtype, arrays)
                                                  for i in wanted), vmap_method="sequential")
        got = once_differentiable(op.name, lambda *xs: call(*xs, **attrs, needs=needs.mask()))(*arrays, *cts, token)
        grads: List[Any] = [None] * len(arrays)
        for i, g in zip(wanted, got):
            if needs.flags[i] and jnp.issubdtype(arrays[i].dtype, jnp.inexact):
                grads[i] = jax_gradient(g)
        return tuple(grads)

    f.defvjp(f_fwd, f_bwd, symbolic_zeros=True)
    return lambda *arrays: f(*_vary_alike(arrays))


# Inputs of fewer bytes than this get no tape: the forward custom call stays one XLA may drop (a loss
# that does not read its output), and the backward runs the function again, which costs less at that
# size than keeping a context (measured at 1 element: 14 against 17 us of CPU per gradient step).
_TAPE_FROM = 1 << 16


def _vary_alike(arrays: Sequence[Any]) -> Tuple[Any, ...]:
    """Under ``shard_map``: every input cast to vary over each mesh axis some input varies over, so the
    custom call's results and gradients have one type, which _struct gives them (JAX checks it; the
    transpose of the cast sums an invariant input's gradient over those axes). Elsewhere, as given."""
    varying = [_manual_type(a).varying if _manual_type(a) is not None else frozenset() for a in arrays]
    axes = frozenset().union(*varying)
    if not axes:
        return tuple(arrays)
    return tuple(a if v >= axes else jax.lax.pcast(a, tuple(sorted(axes - v)), to="varying")
                 for a, v in zip(arrays, varying))


def _manual_type(a: Any) -> Any:
    """``a``'s manual axis type (what mesh axes it varies over inside ``shard_map``), or None (older JAX)."""
    return getattr(jax.typeof(a), "manual_axis_type", None)


def _struct(shape: Any, dtype: Any, arrays: Sequence[Any]) -> jax.ShapeDtypeStruct:
    """A result of the custom call on ``arrays`` (made alike by _vary_alike): inside ``shard_map``, varying
    over the axes they vary over, as JAX requires of a result computed from them."""
    mat = _manual_type(arrays[0]) if arrays else None
    if mat is None or not mat.varying:
        return jax.ShapeDtypeStruct(shape, dtype)
    sharding = jax.sharding.NamedSharding(jax.typeof(arrays[0]).sharding.mesh,
                                          jax.sharding.PartitionSpec(*[None] * len(shape)))
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding, manual_axis_type=mat)
