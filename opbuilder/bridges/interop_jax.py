"""``to_jax(module)``: an operator module's functions as JAX functions.

Each function is a ``jax.custom_vjp`` that works eagerly and under ``jax.jit``, ``jax.grad`` and
``jax.vmap`` (a loop over the batch: ``vmap_method="sequential"``) on the CPU. Array arguments are the
operator's tensors; every other argument (ints, floats, bools, strings, lists; a numpy scalar as the
Python value it holds) is static.

Routes (``f.route(*args)`` names a call's, and why). By default every call is an XLA custom call
(opbuilder/bridges/interop_jax_ffi.py). A C++ module function of tensors runs whole, in C++, on every
call through to_jax's generic handlers (src/jax_ffi.cpp, built once per JAX version), or a module's own
``OB_XLA_FFI`` handlers run its Function: no GIL, no Python per call ("xla_ffi"). Any other call -- a
Python function, static arguments, a 64-bit output with x64 off, a Function seen using
``ctx->saved_data`` -- runs the callback code below as the generic module's host custom call, with the
GIL ("xla_ffi (host Python): <why>"). ``jax.pure_callback`` runs the same code; it is the named
fallback: ``to_jax(..., ffi=False)``, or handlers that cannot be built ("callback: <why>"). The route
is chosen once per signature, at trace time.

Output shapes: from ``shape_fn`` when given; otherwise the operator runs once on zeros of the
arguments' shapes per distinct signature (shapes, dtypes, static values) -- one extra forward, cached.
The XLA FFI route calls the function once on zeros too, to find its entry (with a shape rule its
Functions do not run there; without one, that run is the one above). Static values are keyed
by type and exact value (runtime.jit's ``exact_key``): ``0.0`` and ``-0.0``, ``True``, ``1`` and
``1.0`` are different signatures. With ``jax_enable_x64`` off (JAX's default) a 64-bit output is
returned as its 32-bit twin, as ``jnp`` does.

JAX arrays are immutable: the operator gets private copies of them, so an in-place op (``MarkDirty``)
or one that writes an input runs on a copy and the caller's array is unchanged; under ``jax.grad``
such an op is differentiated like any other (its inputs are copies, never leaves that require grad).

The callback's backward recomputes: it runs the forward again with grad recording and then the C++
``Backward`` (JAX's residuals must be arrays). The XLA FFI route's forward keeps its contexts in the
handlers' bounded table instead, named by a token residual, and its backward runs them. Only the inputs JAX differentiates (custom_vjp's ``perturbed``) get gradients: for the
others NeedsInputGrad is false in Forward and Backward, as in the runtime. Complex gradients: the runtime's are torch's, so the cotangents in and the gradients
out are conjugated (JAX's convention). bfloat16 arrays are ml_dtypes' on the host. See docs/interop.md.
Importing this module imports jax; nothing else in opbuilder does.
"""
from __future__ import annotations

import contextlib
import types
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

import runtime as _rt
from runtime import dtypes as _dtypes
from runtime.jit import tracing as _tracing
from runtime.jit.signature import exact_key as _exact_key
from runtime.call_rules import is_leaf_write_refusal
from runtime.ops import math as _math
from runtime.tensor import Tensor as _Tensor

from .interop_common import Spec, as_specs, check_shape_fns, companion_shape_fns, module_functions, plain_static
from .interop_jax_ffi import (dense_cotangent, ffi_function, ffi_targets, generic_targets, host_call, jax_dtype,
                              jax_gradient, masked_targets, once_differentiable, primal_values, probe_entry,
                              probe_values, runtime_cotangent)

__all__ = ["to_jax"]


def _is_array(a: Any) -> bool:
    return isinstance(a, (jax.Array, np.ndarray)) or hasattr(a, "aval")


def _check_static(a: Any) -> None:
    if isinstance(a, (list, tuple)):
        for e in a:
            _check_static(e)
        return
    try:
        hash(a)
    except TypeError:
        raise TypeError(f"a JAX operator's non-array arguments must be ints, floats, bools, strings or lists of "
                        f"them, got {type(a).__name__}") from None


def _static_key(a: Any) -> Any:
    """The cache key of static values: type and exact value (0.0 and -0.0 differ, True and 1 and 1.0
    differ, a NaN equals itself), as runtime.jit keys its traces -- one rule for every cache."""
    _check_static(a)
    return _exact_key(a)


def _to_runtime(who: str, k: int, arr: np.ndarray, private: bool = True) -> Any:
    """A runtime Tensor over the host array (np.asarray of a JAX array: bfloat16 is ml_dtypes'): a
    writable private copy unless the array is already one, or with ``private=False`` the array itself."""
    arr = np.asarray(arr)
    try:
        _dtypes.from_numpy_dtype(arr.dtype)
    except TypeError as e:
        raise TypeError(f"{who}: argument {k} has dtype {arr.dtype}, which opbuilder's runtime does not "
                        f"support ({e})") from None
    return _Tensor._from_array(arr if arr.flags.writeable or not private else arr.copy())


def _settled(outs: Sequence[Any]) -> Sequence[Any]:
    """``outs`` of an eager call (no tracers: nothing is being traced) once the program that runs the
    callback code has finished. An eager call is an XLA program of its own, dispatched asynchronously,
    and JAX can drop its result unread: ``jax.jacfwd`` runs a ``custom_vjp``'s forward eagerly, then
    raises. jaxlib's CPU client may not have started that program yet; it would then run the Python
    callback when the client is destroyed at interpreter exit, on XLA's thread, where taking the GIL
    ends the thread and aborts the process. Waiting here leaves no callback in flight (issue 33)."""
    if not any(isinstance(o, jax.core.Tracer) for o in outs):
        jax.block_until_ready(outs)
    return outs


def _shapes(specs: Any) -> str:
    return ", ".join(str(list(s.shape)) for s in specs)


class _JaxOp:
    """One module function as JAX functions, one ``custom_vjp`` per static signature."""

    def __init__(self, name: str, fn: Callable, shape_fn: Optional[Callable], writes: Tuple[int, ...] = (),
                 ffi: bool = True, targets: Optional[Tuple[str, str]] = None, masked: bool = False) -> None:
        self.name, self.fn, self.shape_fn = name, fn, shape_fn
        self.writes = writes  # argument positions the function writes (to_jax's mutates)
        self.ffi = ffi  # to_jax's ffi: False keeps every call on the callback path
        self.targets = targets  # the module's own OB_XLA_FFI targets (forward, backward), or None
        self.masked = masked  # whether those targets' backward takes the `needs` attribute
        self.by_sig: Dict[Any, Callable] = {}
        self.out_specs: Dict[Any, Tuple[List[Spec], bool]] = {}
        self.empty_checked: set = set()  # signatures whose empty outputs a run on other values confirmed
        self.routes: Dict[Any, Tuple[Any, str]] = {}
        self.ffi_fns: Dict[Any, Callable] = {}
        self.writes_leaves = False  # seen writing a differentiable input: it gets recorded copies

    def _call_args(self, positions: Tuple[int, ...], statics: Tuple[Any, ...], arrays: Sequence[Any]) -> list:
        args: List[Any] = list(statics)
        for p, a in zip(positions, arrays):
            args.insert(p, a)
        return args

    def _host_forward(self, positions, statics, arrays, grad: bool, needs: Optional[Sequence[bool]] = None):
        """Runs the operator on private copies of ``arrays`` (JAX's are immutable). With ``grad``, each
        differentiable input JAX differentiates (``needs``, default all) is a leaf over the caller's
        (read-only) memory; the others do not require grad, as in the runtime. An op refused for writing
        such a leaf (MarkDirty; the refusal wrote nothing) runs again, and from then on, on a recorded
        copy of each leaf, so it writes a non-leaf, as in torch: an op that writes nothing pays no copy.
        Returns the runtime Tensors made of the arrays, those of them that need grad, the outputs, whether
        it returned one tensor, and the tensors the operator got (the copies, where it writes leaves)."""
        rt, need = [], []
        for k, (p, a) in enumerate(zip(positions, arrays)):
            leaf = grad and np.asarray(a).dtype.kind in _dtypes.GRAD_KINDS and (needs is None or needs[k])
            rt.append(_to_runtime(self.name, p, a, private=not leaf))
            if leaf:
                need.append(rt[-1].requires_grad_(True))
        args = rt
        if need and self.writes_leaves:
            with _rt.enable_grad(), _unwatched():
                args = [_math.mul(r, 1) if r.requires_grad else r for r in rt]
        try:
            with _rt.enable_grad() if grad else _rt.no_grad():
                res = self.fn(*self._call_args(positions, statics, args))
        except RuntimeError as e:
            if not need or self.writes_leaves or not is_leaf_write_refusal(e):
                raise
            self.writes_leaves = True
            return self._host_forward(positions, statics, arrays, grad, needs)
        single = not isinstance(res, (list, tuple))
        outs = [res] if single else list(res)
        for o in outs:
            if not isinstance(o, _rt.Tensor):  # a JAX function's results are arrays
                raise TypeError(f"to_jax: {self.name} returned {type(o).__name__}, not tensors; a function "
                                f"to_jax wraps must return tensors (call the module's function directly for "
                                f"other values)")
        return rt, need, outs, single, args

    @staticmethod
    def _key(positions, statics, arrays) -> Any:
        return (positions, _static_key(list(statics)), tuple((tuple(a.shape), str(a.dtype)) for a in arrays))

    def _run_zeros(self, positions, statics, arrays, pattern: int = -1, grad: bool = False) -> Tuple[list, list]:
        """One run on zeros of the arrays' shapes (at trace time), or on ``probe_values(pattern)`` when
        ``pattern >= 0``: its specs are cached; returns the runtime Tensors the operator got and its outputs.
        ``grad``: the differentiable arrays require grad, as a gradient's run has them (the probe's run,
        so that a Function that keeps saved_data only when NeedGrad says so is seen keeping it)."""
        zeros = [np.zeros(tuple(a.shape), np.dtype(a.dtype)) if pattern < 0
                 else probe_values(tuple(a.shape), np.dtype(a.dtype), pattern) for a in arrays]
        _, _, outs, single, got_args = self._host_forward(positions, statics, zeros, grad=grad)
        if self.shape_fn is None:
            got = ([Spec(tuple(o.shape), np.dtype(o._data.dtype)) for o in outs], single)
            seen = self.out_specs.setdefault(self._key(positions, statics, arrays), got)
            if seen[0] != got[0]:  # an earlier run on other values gave other outputs
                self.out_specs.pop(self._key(positions, statics, arrays), None)  # every call says so
                raise ValueError(
                    f"to_jax: {self.name}'s output shapes depend on its inputs' values ({_shapes(seen[0])} on "
                    f"one run, {_shapes(got[0])} on another, for inputs of shapes "
                    f"{_shapes(Spec(tuple(a.shape), None) for a in arrays)}); JAX needs them fixed by the "
                    f"input shapes: give to_jax a shape_fn for {self.name!r}, or call it outside jax")
        return got_args, outs

    def specs(self, positions, statics, arrays) -> Tuple[List[Spec], bool]:
        """The outputs' shapes and dtypes: the shape rule's, or one run on zeros (cached)."""
        key = self._key(positions, statics, arrays)
        got = self.out_specs.get(key)
        if got is None:
            in_specs = [Spec(tuple(a.shape), np.dtype(a.dtype)) for a in arrays]
            if self.shape_fn is not None:
                got = as_specs(self.name, self.shape_fn(*self._call_args(positions, statics, in_specs)))
            else:
                self._probe(positions, statics, arrays)
                got = self.out_specs[key]
            self.out_specs[key] = got
        if (self.shape_fn is None and key not in self.empty_checked and any(0 in s.shape for s in got[0])
                and not any(0 in np.shape(a) for a in arrays)):
            # an empty output from non-empty inputs (the run on zeros): a run on other values says whether
            # its shape depends on them (a named ValueError)
            self._probe(positions, statics, arrays, 0)
            if all(0 in s.shape for s in got[0]):
                self._refuse_all_empty(positions, statics, arrays, got[0])
            self.empty_checked.add(key)
        return got

    def _refuse_all_empty(self, positions, statics, arrays, specs: List[Spec]) -> None:
        """Every output empty for non-empty inputs, with no shape rule: XLA skips a call whose results are
        all empty (the custom call's and the callback's), so no shape check would ever run and a shape that
        depends on the values would come back empty, silently. The other stand-ins may show that it does
        (the ValueError of ``_run_zeros``); else the signature is refused: a shape rule's empty shapes are
        trusted."""
        for stand_in in (1, 4, 5):
            try:
                self._run_zeros(positions, statics, arrays, stand_in)
            except (TypeError, ValueError) as e:
                if str(e).startswith("to_jax: "):
                    raise
            except Exception:  # noqa: BLE001  (the op refusing these values: they say nothing)
                pass
        self.out_specs.pop(self._key(positions, statics, arrays), None)  # every call says so
        raise ValueError(
            f"to_jax: {self.name} returned only empty outputs ({_shapes(specs)}) for non-empty inputs of "
            f"shapes {_shapes(Spec(tuple(a.shape), None) for a in arrays)} on every run on stand-in values; "
            f"XLA skips a call whose results are all empty, so an output shape that depends on the values "
            f"would come back empty: give to_jax a shape_fn for {self.name!r} (its shapes are trusted)")

    def _probe(self, positions, statics, arrays, pattern: int = -1) -> None:
        """``_run_zeros`` for the output specs. A run on zeros that raises (an op refusing a zero, as a log
        does) is tried again on other stand-ins (``probe_values``: positive, negative, halves, identities),
        the first whose run succeeds giving the specs. An error on all of them is the op's own, raised as
        it came with a note (``add_note``) that these runs made it (not the caller's values) and that a
        shape rule saves them."""
        try:
            self._run_zeros(positions, statics, arrays, pattern)
            return
        except Exception as e:  # noqa: BLE001  (any error of the operator's run)
            if pattern >= 0 or (isinstance(e, (TypeError, ValueError)) and str(e).startswith("to_jax: ")):
                raise
            first = e
        for stand_in in (0, 1, 4, 5):
            try:
                self._run_zeros(positions, statics, arrays, stand_in)
                return
            except Exception:  # noqa: BLE001
                continue
        first.add_note(f"to_jax ran {self.name} on zeros and on other stand-in values of its input shapes to "
                       f"learn its output shapes (it has no shape rule), and each run raised; this is the run on "
                       f"zeros' error. If the values you pass are valid for it, a shape_fn for {self.name!r} "
                       f"saves these runs")
        raise first

    def route(self, positions, statics, arrays) -> Tuple[Any, str]:
        """How a call of this signature runs (cached): ((targets, entry), "xla_ffi...") for the C++
        custom calls, (("host", target), "xla_ffi (host Python): <why>") for the host custom call, or
        (None, "callback: <why>") for jax.pure_callback."""
        key = self._key(positions, statics, arrays)
        got = self.routes.get(key)
        if got is None:
            got = self.routes[key] = self._route(positions, statics, arrays)
        return got

    def _route(self, positions, statics, arrays) -> Tuple[Any, str]:
        if not self.ffi:
            return None, "callback: to_jax(..., ffi=False)"
        why, entry = None, None
        if statics:
            why = "the call has non-array arguments (XLA passes buffers only)"
        else:
            if self.targets is None:  # the generic handlers: find the C++ Function the call is
                # with a shape rule the Function need not run (as on the callback path); without one, the
                # run gives the output specs too
                fake = self.specs(positions, statics, arrays) if self.shape_fn is not None else None
                entry, why = probe_entry(self.fn, lambda k: self._run_zeros(positions, statics, arrays, k, grad=True),
                                         fake)
            if why is None:
                specs, _ = self.specs(positions, statics, arrays)
                if not all(jax_dtype(s.dtype) == s.dtype for s in specs):
                    # the callback code declares and returns it as its 32-bit twin, as jnp does
                    why = "an output is 64-bit while jax_enable_x64 is off"
                elif self.targets is not None:
                    return (self.targets, None), "xla_ffi: the module's OB_XLA_FFI handlers"
        targets, err = generic_targets()
        if targets is None:
            return None, f"callback: {err}"
        if why is None:
            return (targets[:2], entry), "xla_ffi"
        return ("host", targets[2]), f"xla_ffi (host Python): {why}"

    def _ffi_fn(self, positions, how) -> Callable:
        g = self.ffi_fns.get((positions, how))
        if g is None:
            targets, entry = how
            attrs = {"entry": np.int64(entry)} if entry is not None else None
            masked = entry is not None or self.masked  # the generic backward takes `needs`; OB_XLA_FFI's may
            g = self.ffi_fns[(positions, how)] = ffi_function(self, positions, targets, self.writes, attrs, masked,
                                                              bound=entry is not None)
        return g

    def function(self, positions: Tuple[int, ...], statics: Tuple[Any, ...]) -> Callable:
        key = (positions, _static_key(list(statics)))
        f = self.by_sig.get(key)
        if f is None:
            for k in self.writes:
                if k not in positions:
                    raise TypeError(f"{self.name}: mutates names argument {k}, but in this call it is "
                                    f"{'missing' if k >= len(positions) + len(statics) else 'no array'}; declare "
                                    f"the positions of arrays the function writes")
            f = self.by_sig[key] = self._make(positions, statics)
        return f

    def _make(self, positions: Tuple[int, ...], statics: Tuple[Any, ...]) -> Callable:
        """The signature's function: an XLA custom call where ``route`` finds one, else the callback."""
        via_callback = self._make_callback(positions, statics)
        via_host: Dict[str, Callable] = {}

        def f(*arrays: Any) -> Any:
            how, _ = self.route(positions, statics, arrays)
            if how is None:
                return via_callback(*arrays)
            if how[0] == "host":
                g = via_host.get(how[1])
                if g is None:
                    g = via_host[how[1]] = self._make_callback(positions, statics, host_call(how[1], {}))
                return g(*arrays)
            return self._ffi_fn(positions, how)(*arrays)
        return f

    def _make_callback(self, positions: Tuple[int, ...], statics: Tuple[Any, ...],
                       host: Optional[Callable] = None) -> Callable:
        """The signature's function over its callback code (host Python): through jax.pure_callback (the
        named fallback), or with ``host`` (interop_jax_ffi.host_call) as the generic module's host custom
        call, which runs the same code without JAX's callback machinery."""
        op = self

        def run(key: Any, cb: Callable, structs: Sequence[Any], *arrays: Any) -> Any:
            if host is not None:
                return _settled(host(key, cb, structs, *arrays))
            return _settled(jax.pure_callback(cb, tuple(structs), *arrays, vmap_method="sequential"))

        def forward_cb(*arrays):
            _, _, outs, _, _ = op._host_forward(positions, statics, arrays, grad=False)
            # with x64 off, a 64-bit output is declared (out_struct) and returned as its 32-bit twin
            return tuple(np.asarray(o._data).astype(jax_dtype(o._data.dtype), copy=False) for o in outs)

        def backward_cb(n_out, needs, *arrays_and_cts):
            arrays, cts = arrays_and_cts[:-n_out], arrays_and_cts[-n_out:]
            rt, need, outs, _, _ = op._host_forward(positions, statics, arrays, grad=True, needs=needs)
            # a cotangent in the output's own dtype (it came as the 32-bit twin with x64 off), the runtime's convention
            pairs = [(o, _to_runtime(op.name, i, runtime_cotangent(np.asarray(g, dtype=o._data.dtype))))
                     for i, (o, g) in enumerate(zip(outs, cts)) if o.requires_grad]
            grads = [np.zeros(np.shape(a), np.asarray(a).dtype) for a in arrays]
            if pairs and need:
                gs = _rt.autograd.grad([o for o, _ in pairs], need, [g for _, g in pairs], allow_unused=True)
                it = iter(gs)
                for i, r in enumerate(rt):
                    if r.requires_grad:
                        g = next(it)
                        if g is not None:
                            grads[i] = jax_gradient(np.asarray(g._data, dtype=grads[i].dtype))
            return tuple(grads)

        def out_struct(arrays):
            specs, single = op.specs(positions, statics, arrays)
            return [jax.ShapeDtypeStruct(s.shape, jax_dtype(s.dtype)) for s in specs], single

        @jax.custom_vjp
        def f(*arrays):
            structs, single = out_struct(arrays)
            outs = run("forward", forward_cb, tuple(structs), *arrays)
            return outs[0] if single else tuple(outs)

        def f_fwd(*args):
            arrays, needs = primal_values(args)
            return f(*arrays), (arrays, needs)

        def f_bwd(res, ct):
            arrays, needs = res
            out_structs, _ = out_struct(arrays)
            cts = (ct,) if not isinstance(ct, tuple) else ct
            cts = tuple(dense_cotangent(c, s.shape, s.dtype) for c, s in zip(cts, out_structs))
            structs = tuple(jax.ShapeDtypeStruct(np.shape(a), a.dtype) for a in arrays)
            grads = once_differentiable(op.name, lambda *xs: run(
                ("backward", len(cts), needs.flags), lambda *ys: backward_cb(len(cts), needs.flags, *ys),
                structs, *xs))(*arrays, *cts)
            return tuple(g if n and jnp.issubdtype(a.dtype, jnp.inexact) else None
                         for a, g, n in zip(arrays, grads, needs.flags))

        f.defvjp(f_fwd, f_bwd, symbolic_zeros=True)
        return f


@contextlib.contextmanager
def _unwatched() -> Iterator[None]:
    """This thread's tracer off: what runs here is to_jax's own plumbing (a copy of a leaf an op writes), not
    the function's work, which to_jax's probe watches (it took the copy's mul for the function's and sent a
    MarkDirty op to the host route)."""
    prev = _tracing.hook.tracer
    _tracing.hook.tracer = None
    try:
        yield
    finally:
        _tracing.hook.tracer = prev


def _check_mutates(funcs: Dict[str, Callable], mutates: Any) -> Dict[str, Tuple[int, ...]]:
    """``mutates`` checked: function names of the module to non-negative argument positions."""
    if mutates is None:
        return {}
    if not isinstance(mutates, dict):
        raise TypeError(f"to_jax: mutates must be a dict from function name to argument positions, got "
                        f"{type(mutates).__name__}")
    out = {}
    for name, pos in mutates.items():
        if name not in funcs:
            raise ValueError(f"to_jax: mutates names {name!r}, which the module does not define "
                             f"(it has {', '.join(sorted(funcs))})")
        if (not isinstance(pos, (list, tuple)) or not pos
                or not all(isinstance(k, int) and not isinstance(k, bool) and k >= 0 for k in pos)):
            raise TypeError(f"to_jax: mutates[{name!r}] must be a non-empty list of argument positions "
                            f"(ints >= 0), got {pos!r}")
        out[name] = tuple(sorted(set(pos)))
    return out


def _wrapper(op: _JaxOp) -> Callable:
    def call(*args: Any) -> Any:
        for k, a in enumerate(args):
            if isinstance(a, (list, tuple)) and any(_is_array(x) for x in a):
                raise TypeError(f"{op.name}: argument {k} is a {type(a).__name__} of arrays; to_jax passes arrays "
                                f"one by one (a list of tensors, TensorPtrList, is not supported): bind a function "
                                f"that takes each tensor as its own argument")
        args = tuple(a if _is_array(a) else plain_static(a) for a in args)
        positions = tuple(k for k, a in enumerate(args) if _is_array(a))
        statics = tuple(a for a in args if not _is_array(a))
        for k, a in enumerate(args):
            if not _is_array(a) and a is not None and not isinstance(a, (bool, int, float, str, list, tuple)):
                raise TypeError(f"{op.name}: argument {k} is a {type(a).__name__}; a JAX operator takes arrays, "
                                f"None (an optional tensor left out), ints, floats, bools, strings and lists of them")
        if not positions:
            raise TypeError(f"{op.name}: a JAX operator needs at least one array argument")
        return op.function(positions, statics)(*[args[p] for p in positions])

    def route(*args: Any) -> str:
        """How a call with these arguments runs: "xla_ffi" (a custom call, C++ only), "xla_ffi (host
        Python): <why>" (a custom call running the callback code) or "callback: <why>" (jax.pure_callback)."""
        args = tuple(a if _is_array(a) else plain_static(a) for a in args)
        positions = tuple(k for k, a in enumerate(args) if _is_array(a))
        arrays = [jax.ShapeDtypeStruct(np.shape(args[p]), args[p].dtype) for p in positions]
        return op.route(positions, tuple(a for a in args if not _is_array(a)), arrays)[1]

    call.__name__ = call.__qualname__ = op.name
    call.__doc__ = op.fn.__doc__
    call.route = route  # type: ignore[attr-defined]
    return call


def to_jax(module: Any, shape_fn: Optional[Dict[str, Callable]] = None,
           mutates: Optional[Dict[str, Sequence[int]]] = None, ffi: bool = True) -> types.SimpleNamespace:
    """``module``'s functions as JAX functions (custom_vjp over XLA custom calls, or host callbacks
    where a call cannot be one; jit, grad, vmap). ``ffi=False`` keeps every call on the callback
    (jax.pure_callback); each function's ``route(*args)`` says which a call takes, and why.

    ``shape_fn`` maps a function name to its shape rule (see ``Spec``); without one, the rule of its
    ``<name>_infer_shape`` companion (a C++ ``InferShape``) if bound, else the output shapes come
    from one run of the operator on zeros per distinct signature. ``mutates`` maps a function name to
    the positions of the array arguments it writes in place and returns (as for ``to_torch``): on the
    XLA FFI path each is declared aliased to its output (``input_output_aliases``), so XLA copies it
    (or takes a donated buffer) and the kernel writes that, not the caller's array (no copy of its
    own). Without it a Function gets writable private copies (it may write them; the output is their
    values), or, with ``kAcceptsViews`` once its type is known to write nothing, XLA's buffers read-only.
    """
    if not isinstance(ffi, bool):
        raise TypeError(f"to_jax: ffi must be True or False, got {type(ffi).__name__}")
    funcs = module_functions(module)
    shape_fns = companion_shape_fns(module, funcs, check_shape_fns("to_jax", funcs, shape_fn))
    writes = _check_mutates(funcs, mutates)
    targets = ffi_targets(module, funcs, shape_fns) if ffi else {}
    out = types.SimpleNamespace()
    for name, fn in funcs.items():
        op = _JaxOp(name, fn, shape_fns.get(name), writes.get(name, ()), ffi, targets.get(name),
                    masked_targets(module, name))
        setattr(out, name, _wrapper(op))
    return out
