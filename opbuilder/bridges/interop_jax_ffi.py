"""``to_jax``'s XLA FFI path: a module function whose C++ ``Function`` was bound with
``OB_XLA_FFI`` (the PyCapsules ``<name>_xla_fwd`` / ``<name>_xla_bwd``, see
include/opbuilder/xla_ffi.h) runs as an XLA custom call (``jax.ffi.ffi_call``) instead of
a host callback: no GIL, no Python per call. XLA's buffers are never written: a Function gets
writable private copies of its inputs (an in-place op, MarkDirty or not, runs on a copy whose values
are the output, as on the callback path), or with ``kAcceptsViews`` and a type known to write nothing
(a call completed without a write) XLA's memory itself, read-only (no copy); a MarkDirty on that
reruns Forward on copies, which the type gets from then on.

Result shapes come from the shape rule (the ``<name>_infer_shape`` companion or
``shape_fn``); a function with handlers but no rule is an error, since the custom call
cannot probe. Calls with non-array (static) arguments fall back to the callback path, and so
do calls with a 64-bit output while ``jax_enable_x64`` is off (the callback path declares
and returns the 32-bit type, as ``jnp`` does). Complex gradients follow JAX's convention on
both paths: the handlers compute the runtime's (torch's), and the cotangents in and the
gradients out are conjugated (``runtime_cotangent``, ``jax_gradient``).
"""
from __future__ import annotations

import itertools
import weakref
from typing import Any, Callable, Dict, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from runtime.call_rules import to_framework_cotangent as _to_framework_cotangent

__all__ = ["FFI_FWD", "FFI_BWD", "ffi_targets", "ffi_function", "runtime_cotangent", "jax_gradient",
           "jax_dtype"]

FFI_FWD, FFI_BWD = "_xla_fwd", "_xla_bwd"

_registered: "weakref.WeakKeyDictionary[Any, Dict[str, Tuple[str, str]]]" = weakref.WeakKeyDictionary()
_serial = itertools.count()


def ffi_targets(module: Any, funcs: Dict[str, Callable], shape_fns: Dict[str, Callable]) -> Dict[str, Tuple[str, str]]:
    """The XLA target names (forward, backward) of ``module``'s functions that have FFI handlers;
    each is registered with XLA once per module object. ValueError for one without a shape rule."""
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


def _cotangent(ct: Any, struct: jax.ShapeDtypeStruct) -> Any:
    """A cotangent as an array of the output's dtype (integer outputs get float0 ones from JAX)."""
    if getattr(ct, "dtype", None) == jax.dtypes.float0:
        return jnp.zeros(struct.shape, struct.dtype)
    return ct


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


def ffi_function(op: Any, positions: Tuple[int, ...], targets: Tuple[str, str],
                 writes: Tuple[int, ...] = ()) -> Callable:
    """A ``custom_vjp`` over the XLA custom calls ``targets`` (forward, backward) for an all-array call
    of ``op`` (to_jax's ``_JaxOp``: its ``specs`` gives the result shapes). The arguments at positions
    ``writes`` are declared to XLA as aliased to an output: XLA copies each into that result buffer (or
    uses a donated one), and the handler gives Forward that buffer to write."""
    fwd_target, bwd_target = targets

    def out_structs(arrays):
        specs, single = op.specs(positions, (), arrays)
        return tuple(_struct(s.shape, s.dtype, arrays) for s in specs), single

    @jax.custom_vjp
    def f(*arrays):
        structs, single = out_structs(arrays)
        aliases = _aliases(op.name, positions, writes, arrays, structs) if writes else {}
        outs = jax.ffi.ffi_call(fwd_target, structs, vmap_method="sequential",
                                input_output_aliases=aliases or None)(*arrays)
        return outs[0] if single else tuple(outs)

    def f_fwd(*arrays):
        return f(*arrays), arrays

    def f_bwd(arrays, ct):
        structs, _ = out_structs(arrays)
        cts = (ct,) if not isinstance(ct, tuple) else ct
        cts = tuple(runtime_cotangent(_cotangent(c, s)) for c, s in zip(cts, structs))
        # an input Forward writes (declared) gets a scratch result aliased to it: XLA copies it there
        written = [positions.index(k) for k in writes]
        scratch = tuple(_struct(np.shape(arrays[i]), arrays[i].dtype, arrays) for i in written)
        grads = jax.ffi.ffi_call(bwd_target, tuple(_struct(np.shape(a), a.dtype, arrays) for a in arrays)
                                 + scratch, vmap_method="sequential",
                                 input_output_aliases={i: len(arrays) + m for m, i in enumerate(written)} or None)(
                                     *arrays, *cts)[:len(arrays)]
        return tuple(jax_gradient(g) if np.issubdtype(a.dtype, np.inexact) else None for a, g in zip(arrays, grads))

    f.defvjp(f_fwd, f_bwd)
    return lambda *arrays: f(*_vary_alike(arrays))


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
