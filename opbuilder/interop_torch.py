"""``to_torch(module)``: an operator module's functions as PyTorch operators.

Each function becomes a ``torch.library`` operator (one per call signature,
defined on first use: tensors and plain ints, floats, bools, strings and lists
have fixed schema types). Tensors cross without copies both ways: torch ->
runtime through ``Tensor.numpy()`` (DLPack off the CPU), runtime -> torch through
``torch.from_numpy`` on the buffer the kernel wrote; bfloat16 crosses both ways as a uint16 view
(numpy has no bfloat16 of its own). Eager calls that no mode
or tensor subclass must see skip torch.library's Python layers and call the
same kernels directly (through a ``torch.autograd.Function`` when recording
grad). Autograd: the forward runs once through the runtime
with the inputs that require grad marked; the runtime graph is kept alive by
the output's memory, and torch's backward runs the runtime backward on it (the
C++ ``Backward``). Where no graph was kept (a compiled graph, ``opcheck``),
the backward op recomputes the forward with grad recording. Importing this
module imports torch; nothing else in opbuilder does.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
import types
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.autograd.forward_ad as _forward_ad
from torch.utils._python_dispatch import _get_current_dispatch_mode as _current_mode

import runtime as _rt
from runtime import dtypes as _dtypes
from runtime.autograd.grad_mode import _state as _rt_grad
from runtime.autograd.saved_hooks import saved_tensors_hooks as _rt_saved_hooks
from runtime.dlpack_host import torch_array as _torch_array
from runtime.tensor import Tensor as _Tensor

from . import torch_bridge as _torch_bridge
from .interop_common import Spec, as_specs, check_shape_fns, companion_shape_fns, module_functions

__all__ = ["to_torch"]

_SCHEMA = {"t": "Tensor", "b": "bool", "i": "int", "f": "float", "s": "str", "I": "int[]", "F": "float[]",
           "L": "Tensor[]"}
_namespaces = itertools.count()
# data_ptr of an output -> the kept runtime call; an entry lives as long as that output's memory
_kept: "weakref.WeakValueDictionary[int, _Call]" = weakref.WeakValueDictionary()
# torch's grad mode at the user's call (the kernel itself runs with grad off, below autograd)
_mode = threading.local()
_function_mode = torch._C._is_torch_function_mode_enabled
_grad_enabled = torch.is_grad_enabled
_is_compiling = torch.compiler.is_compiling
_define_lock = threading.RLock()


class _Call:
    """One recorded runtime call: its inputs needing grad (by flat tensor index) and its outputs."""
    __slots__ = ("inputs", "index", "outputs", "__weakref__")

    def __init__(self, inputs: List[Any], index: List[int], outputs: List[Any]) -> None:
        self.inputs, self.index, self.outputs = inputs, index, outputs


class _Keep:
    """An array's interface plus the call it came from: the base of the array torch gets, so the
    runtime graph lives exactly as long as the output's memory."""
    __slots__ = ("__array_interface__", "arr", "call", "__weakref__")

    def __init__(self, arr: np.ndarray, call: _Call) -> None:
        self.__array_interface__ = arr.__array_interface__
        self.arr, self.call = arr, call


def _code(who: str, k: int, a: Any) -> str:
    if isinstance(a, torch.Tensor):
        return "t"
    if isinstance(a, bool):
        return "b"
    if isinstance(a, int):
        return "i"
    if isinstance(a, float):
        return "f"
    if isinstance(a, str):
        return "s"
    if isinstance(a, (list, tuple)) and a:
        if all(isinstance(e, torch.Tensor) for e in a):
            return "L"
        if all(isinstance(e, int) and not isinstance(e, bool) for e in a):
            return "I"
        if all(isinstance(e, (int, float)) and not isinstance(e, bool) for e in a):
            return "F"
    raise TypeError(f"{who}: argument {k} is a {type(a).__name__}; a torch operator takes tensors, ints, "
                    f"floats, bools, strings and non-empty lists of tensors, ints or floats")


# torch dtypes whose numpy view the runtime takes as it is (the fast path of _to_runtime)
_PLAIN = frozenset(getattr(torch, n) for n in ("float16", "float32", "float64", "int8", "int16", "int32", "int64",
                                              "uint8", "uint16", "uint32", "uint64", "bool", "complex64",
                                              "complex128"))
_GRAD_KINDS = _dtypes.GRAD_KINDS


def _to_runtime(who: str, k: int, t: torch.Tensor, devices: Tuple[str, ...]) -> Any:
    if t.is_cpu and t.dtype in _PLAIN:
        try:
            return _Tensor._from_array(t.detach().numpy())
        except RuntimeError:  # a conjugate or negative view: numpy has none, torch resolves it (a copy)
            return _Tensor._from_array(t.detach().resolve_conj().resolve_neg().numpy())
    dev = t.device.type
    if dev not in devices:
        raise ValueError(f"{who}: argument {k} is a {dev} tensor; this operator runs on "
                         f"{' and '.join(devices)} tensors (move it with .to('{devices[0]}'))")
    try:
        if dev == "cpu":  # Tensor.numpy() shares memory and is several times cheaper than DLPack
            arr = _torch_array(t.detach())  # bfloat16 too
            _dtypes.from_numpy_dtype(arr.dtype)
            return _Tensor._from_array(arr)
        return _rt.from_dlpack(t.detach())
    except (TypeError, BufferError, RuntimeError) as e:
        raise TypeError(f"{who}: argument {k} has dtype {t.dtype}, which opbuilder's runtime does not support "
                        f"({e})") from None


def _from_numpy(arr: np.ndarray) -> torch.Tensor:
    """``torch.from_numpy``, bfloat16 included (through a uint16 view of the same memory); a view
    with negative strides, which torch cannot describe, as a contiguous copy."""
    try:
        return torch.from_numpy(arr)
    except TypeError:
        if arr.dtype != _dtypes.bfloat16.np:
            raise
        return torch.from_numpy(arr.view(np.uint16)).view(torch.bfloat16)
    except ValueError:
        if not any(s < 0 for s in arr.strides):
            raise
        return _from_numpy(np.ascontiguousarray(arr))


def _to_torch(out: Any, call: Optional[_Call]) -> torch.Tensor:
    arr = out._data
    if not isinstance(arr, np.ndarray):  # a CUDA array (CuPy): DLPack shares it
        return torch.from_dlpack(arr)
    if call is not None:
        bf16 = arr.dtype.kind == "V"  # the interface keeps bfloat16 only as raw bytes: keep uint16
        arr = np.asarray(_Keep(arr.view(np.uint16) if bf16 else arr, call))
        if bf16:
            return torch.from_numpy(arr).view(torch.bfloat16)
    return _from_numpy(arr)


_NO_HOOKS = contextlib.nullcontext()


def _saved_hooks(op: "_Op", recording: bool) -> Any:
    """torch's saved_tensors_hooks in force, as the runtime's (runtime/autograd/saved_hooks.py) while
    ``op`` records: what it saves goes through them as the C++ bridge sends it (torch's SavedVariable),
    zero-copy both ways. A null context when nothing records or no hooks are set."""
    top = torch._C._autograd._top_saved_tensors_default_hooks(False) if recording else None
    if top is None:
        return _NO_HOOKS
    pack, unpack = top

    def unpacked(packed: Any) -> Any:
        t = unpack(packed)
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op.name}: the saved_tensors_hooks unpack hook returned a {type(t).__name__}; "
                            f"it must return a torch.Tensor")
        return _to_runtime(op.name, 0, t, op.devices)

    return _rt_saved_hooks(lambda t: pack(_to_torch(t, None)), unpacked)


class _Op:
    """The torch operators of one module function, one per call signature."""

    def __init__(self, ns: str, lib: Any, name: str, fn: Callable, shape_fn: Optional[Callable],
                 devices: Tuple[str, ...]) -> None:
        self.ns, self.lib, self.name, self.fn, self.shape_fn, self.devices = ns, lib, name, fn, shape_fn, devices
        self.by_sig: Dict[str, Tuple[Any, List[bool]]] = {}

    # ---- the runtime side ----
    def _runtime_args(self, args: Sequence[Any], sig: str, grad: Callable[[torch.Tensor, str], bool]
                      ) -> Tuple[list, list, list]:
        """Runtime arguments, the flat runtime tensors needing grad, and their flat indices."""
        out, need, index, flat = [], [], [], 0
        for k, (a, c) in enumerate(zip(args, sig)):
            if c == "t":  # the common case, without the list's steps
                r = _to_runtime(self.name, k, a, self.devices)
                if grad(a, c) and r._data.dtype.kind in _GRAD_KINDS:
                    r.requires_grad = True  # a fresh floating leaf: requires_grad_'s checks hold
                    need.append(r)
                    index.append(flat)
                out.append(r)
                flat += 1
            elif c == "L":
                conv = []
                for t in a:
                    r = _to_runtime(self.name, k, t, self.devices)
                    if grad(t, c) and r._data.dtype.kind in _GRAD_KINDS:
                        r.requires_grad = True
                        need.append(r)
                        index.append(flat)
                    conv.append(r)
                    flat += 1
                out.append(conv)
            else:
                out.append(list(a) if c in "IF" else a)
        return out, need, index

    def _run(self, rt_args: list) -> Tuple[list, bool]:
        res = self.fn(*rt_args)
        single = not isinstance(res, (list, tuple))
        return ([res] if single else list(res)), single

    def forward_impl(self, sig: str, args: Sequence[Any]) -> List[torch.Tensor]:
        outs, call = self.record(sig, args)
        res = [_to_torch(o, call) for o in outs]
        if call is not None:  # the registered operator's backward finds the call through the outputs
            for t in res:
                if t.numel():
                    _kept[t.data_ptr()] = call
        return res

    def record(self, sig: str, args: Sequence[Any]) -> Tuple[List[Any], Optional[_Call]]:
        """Run the op on ``args`` (recording the runtime graph when an input needs grad): its
        runtime outputs and the recorded call (None when nothing was recorded)."""
        record = getattr(_mode, "grad", True)
        rt_args, need, index = self._runtime_args(args, sig, lambda t, c: record and t.requires_grad)
        if need:
            with _saved_hooks(self, True):  # torch's saved_tensors_hooks, for what the op saves
                if _rt_grad.enabled:  # the runtime's own grad mode (torch's is off inside a Function)
                    outs, single = self._run(rt_args)
                else:
                    with _rt.enable_grad():
                        outs, single = self._run(rt_args)
            call = _Call(need, index, outs)
        else:
            outs, single = self._run(rt_args)
            call = None
        self.by_sig[sig][1][0] = single
        return outs, call

    def forward_direct(self, sig: str, tpos: Tuple[int, ...], args: Sequence[Any]) -> List[torch.Tensor]:
        """``forward_impl`` for an eager call that records nothing: the C++ op takes each CPU
        tensor's numpy view as it is (no runtime.Tensor in between), and its results go back through
        ``torch.from_numpy``. Anything numpy cannot view takes ``forward_impl`` and its errors."""
        conv = list(args)
        try:
            for i in tpos:
                t = conv[i]
                conv[i] = (t.detach() if t.requires_grad else t).numpy()
        except (TypeError, RuntimeError):  # another device, bfloat16, a conjugate view: say why there
            _mode.grad = torch.is_grad_enabled()
            return self.forward_impl(sig, args)
        res = self.fn(*conv)
        if isinstance(res, (list, tuple)):
            return [_to_torch(o, None) for o in res]
        data = res._data
        if type(data) is np.ndarray:
            try:
                return [torch.from_numpy(data)]
            except (TypeError, ValueError):  # bfloat16, negative strides
                return [_from_numpy(data)]
        return [_to_torch(res, None)]

    def backward_impl(self, sig: str, outputs: List[torch.Tensor], grads: List[torch.Tensor],
                      args: Sequence[Any], call: Optional[_Call] = None) -> List[torch.Tensor]:
        """Input gradients: through the recorded runtime call (``call``, else the one kept with the
        outputs' memory), or, when there is none, through a new recording of the forward."""
        flat = [t for a, c in zip(args, sig) if c in "tL" for t in ([a] if c == "t" else a)]
        for o in outputs if call is None else ():
            if o.numel():
                call = _kept.get(o.data_ptr())
                break
        if call is None or len(call.outputs) != len(outputs):  # nothing kept: record the forward again
            # tensors in lists get no gradients from a Function (the runtime says so when they need one)
            rt_args, need, index = self._runtime_args(args, sig, lambda t, c: c == "t")
            with _rt.enable_grad():
                outs, _ = self._run(rt_args)
            call, retain = _Call(need, index, outs), False
        else:
            retain = True  # torch may call backward again on its graph (gradcheck does)
        pairs = [(o, _to_runtime(self.name, i, g, self.devices))
                 for i, (o, g) in enumerate(zip(call.outputs, grads)) if o.requires_grad and g is not None]
        res: List[Optional[torch.Tensor]] = [None] * len(flat)
        if pairs and call.inputs:
            gs = _rt.autograd.grad([o for o, _ in pairs], call.inputs, [g for _, g in pairs],
                                   retain_graph=retain, allow_unused=True)
            for i, g in zip(call.index, gs):
                if g is not None:
                    res[i] = torch.from_dlpack(g) if not isinstance(g._data, np.ndarray) else \
                        _from_numpy(np.ascontiguousarray(g._data))
        return [torch.zeros_like(t) if r is None else r for t, r in zip(flat, res)]

    # ---- the torch side ----
    def define(self, sig: str, args: Sequence[Any]) -> Tuple[str, List[Optional[bool]]]:
        """Define the forward and backward operators for call signature ``sig`` (``args``: its
        arguments as ``_spec_key`` gives them)."""
        opname = f"{self.name}_{sig}" if sig else self.name
        params = ", ".join(f"{_SCHEMA[c]} a{k}" for k, c in enumerate(sig))
        single: List[Optional[bool]] = [None]
        if self.shape_fn is not None:  # first: a rule that fails leaves nothing half-defined
            single[0] = as_specs(self.name, self.shape_fn(*_specs(args, sig)))[1]
        self.lib.define(f"{opname}({params}) -> Tensor[]")
        self.lib.define(f"{opname}_backward(Tensor[] outputs, Tensor[] grads{', ' if params else ''}{params}) "
                        f"-> Tensor[]")
        # every device reaches the Python kernel, which names the devices it takes (a clear error)
        key = "CompositeExplicitAutograd"
        self.lib.impl(opname, lambda *a: self.forward_impl(sig, a), key)
        self.lib.impl(f"{opname}_backward", lambda outputs, grads, *a: self.backward_impl(sig, outputs, grads, a),
                      key)
        qual = f"{self.ns}::{opname}"
        if self.shape_fn is not None:
            torch.library.register_fake(qual, self._fake(sig), lib=self.lib)
            torch.library.register_fake(f"{qual}_backward", lambda outputs, grads, *a: [
                torch.empty_like(t) for x, c in zip(a, sig) if c in "tL" for t in ([x] if c == "t" else x)],
                lib=self.lib)
        bwd = getattr(getattr(torch.ops, self.ns), f"{opname}_backward").default
        ntensor = sum(1 for c in sig if c in "tL")

        def setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Any) -> None:
            if not _is_compiling():  # real outputs: the runtime's record says which have no gradient
                no_grad = _no_grad_outputs(output)
                if no_grad:
                    ctx.mark_non_differentiable(*no_grad)
            ctx.save_for_backward(*output)
            ctx.args = tuple(None if c in "tL" else a for a, c in zip(inputs, sig))
            ctx.tensors = [a for a, c in zip(inputs, sig) if c in "tL"]

        def backward(ctx: Any, grads: List[Optional[torch.Tensor]]) -> Tuple[Any, ...]:
            outputs = list(ctx.saved_tensors)
            gs = [torch.zeros_like(o) if g is None else g for o, g in zip(outputs, grads)]
            it = iter(ctx.tensors)
            args = [next(it) if c in "tL" else a for a, c in zip(ctx.args, sig)]
            flat = iter(bwd(outputs, gs, *args))
            res = []
            for a, c in zip(args, sig):
                if c == "t":
                    res.append(next(flat))
                elif c == "L":
                    res.append([next(flat) for _ in a])
                else:
                    res.append(None)
            return tuple(res)

        if ntensor:
            torch.library.register_autograd(qual, backward, setup_context=setup_context, lib=self.lib)
        self.by_sig[sig] = (opname, single)
        return self.by_sig[sig]

    def _fake(self, sig: str) -> Callable:
        _DT = {_dtypes.to_dtype(n).np: getattr(torch, n) for n in (
            "float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
            "uint32", "uint64", "bool", "complex64", "complex128")}

        def fake(*args: Any) -> List[torch.Tensor]:
            keys = [_spec_key(a, c) for a, c in zip(args, sig)]
            specs, _ = as_specs(self.name, self.shape_fn(*_specs(keys, sig)))
            dev = next(t.device for a, c in zip(args, sig) if c in "tL" for t in ([a] if c == "t" else a))
            return [torch.empty(s.shape, dtype=_DT[s.dtype], device=dev) for s in specs]
        return fake


def _no_grad_outputs(outputs: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """The outputs of a registered operator's eager forward that the runtime recorded no gradient for:
    all of them when it recorded nothing (a plain C++ function), else those whose runtime tensor does
    not require grad (MarkNonDifferentiable, integer outputs). Empty when it cannot tell."""
    call = None
    for o in outputs:
        if o.numel():
            try:
                call = _kept.get(o.data_ptr())
            except RuntimeError:  # no memory (a fake tensor): nothing to tell
                return []
            if call is None:
                return list(outputs)
            break
    if call is None or len(call.outputs) != len(outputs):
        return []
    return [o for o, r in zip(outputs, call.outputs) if not r.requires_grad]


class _Eager(torch.autograd.Function):
    """What the registered operator's autograd does (same forward and backward kernels), for eager
    calls that no mode or tensor subclass needs to see: torch.library's Python autograd layer
    (pytree, defaults, redispatch) costs more than the C++ op itself on small tensors."""

    @staticmethod
    def forward(ctx: Any, op: "_Op", sig: str, *args: Any) -> Tuple[torch.Tensor, ...]:
        rt_outs, call = op.record(sig, args)
        outs = [_to_torch(o, None) for o in rt_outs]
        # what the runtime recorded no gradient for (MarkNonDifferentiable, integers, a plain C++
        # function) does not require grad in torch either: no silent zero gradients
        ctx.mark_non_differentiable(*[t for t, o in zip(outs, rt_outs) if not o.requires_grad])
        ctx.op, ctx.sig, ctx.call = op, sig, call  # the runtime graph lives as long as torch's
        ctx.args = tuple(None if c == "t" else a for a, c in zip(args, sig))
        ctx.ntensor = sig.count("t")
        ctx.save_for_backward(*[a for a, c in zip(args, sig) if c == "t"], *outs)
        return tuple(outs)

    @staticmethod
    def backward(ctx: Any, *grads: Optional[torch.Tensor]) -> Tuple[Any, ...]:
        saved = ctx.saved_tensors
        tensors, outputs = iter(saved[:ctx.ntensor]), list(saved[ctx.ntensor:])
        args = [next(tensors) if c == "t" else a for a, c in zip(ctx.args, ctx.sig)]
        gs = [torch.zeros_like(o) if g is None else g for o, g in zip(outputs, grads)]
        flat = iter(ctx.op.backward_impl(ctx.sig, outputs, gs, args, ctx.call))
        return (None, None) + tuple(next(flat) if c == "t" else None for c in ctx.sig)


def _wrapper(op: _Op) -> Callable:
    """The user-facing function: picks (or defines) the operator for the call's signature."""
    def ensure(sig: str, specs: Tuple[Any, ...]) -> str:
        # runs eagerly even while torch.compile traces (assume_constant_result): defining an
        # operator is not traceable, and its name is a constant of the call's signature
        with _define_lock:  # two threads' first calls define the operator once
            entry = op.by_sig.get(sig)
            if entry is None:
                entry = op.define(sig, specs)
        return f"{entry[0]}|{int(bool(entry[1][0]))}"

    ensure_c = torch._dynamo.assume_constant_result(ensure)
    packet = getattr(torch.ops, op.ns)

    fast: Dict[str, Tuple[Any, List[Optional[bool]]]] = {}  # sig -> (OpOverload, single), eager calls
    # the argument types of eager calls whose signature they fix (plain torch.Tensors, no lists) ->
    # (sig, tensor positions, single): the lean path of `call`
    direct: Dict[Tuple[type, ...], Tuple[str, Tuple[int, ...], List[Optional[bool]]]] = {}

    def general(*args: Any) -> Any:
        sig = "".join([_code(op.name, k, a) for k, a in enumerate(args)])
        if not torch.compiler.is_compiling():
            hit = fast.get(sig)
            if hit is not None:
                grad = _mode.grad = torch.is_grad_enabled()
                # nothing to record and no mode or subclass that must see the operator: the kernel
                # the dispatcher would pick, called directly (torch's Python op dispatch is ~10 us)
                plain = all(type(a) is torch.Tensor for a, c in zip(args, sig) if c == "t")
                if plain and hit[1][0] is not None and not any(c in "LIF" for c in sig):
                    direct[tuple(map(type, args))] = (sig, tuple(k for k, c in enumerate(sig) if c == "t"), hit[1])
                if "L" not in sig and _current_mode() is None and not _function_mode() and plain:
                    if grad and any(a.requires_grad for a, c in zip(args, sig) if c == "t"):
                        out = _Eager.apply(op, sig, *args)  # the op's own autograd, minus its Python layers
                    else:
                        out = op.forward_impl(sig, args)
                else:
                    out = hit[0](*args)
                return out[0] if hit[1][0] else out
        specs = tuple(_spec_key(a, c) for a, c in zip(args, sig))
        opname, single = ensure_c(sig, specs).split("|")
        overload = getattr(packet, opname).default
        if not torch.compiler.is_compiling():
            _mode.grad = torch.is_grad_enabled()
            fast[sig] = (overload, op.by_sig[sig][1])
        out = overload(*args)
        return out[0] if (single == "1" or op.by_sig[sig][1][0]) else out

    if op.shape_fn is None:  # no fake kernel: torch.compile runs this call eagerly (a graph break)
        general = torch.compiler.disable(general)

    def call(*args: Any) -> Any:
        if _forward_ad._current_level >= 0:  # a dual level is open: refuse tangents, never drop them
            _refuse_tangents(op.name, args)
        # an eager call seen before, with nothing that must see the operator: the fewest steps
        if not _is_compiling():
            hit = direct.get(tuple(map(type, args)))
            if hit is not None and _current_mode() is None and not _function_mode():
                sig, tpos, single = hit
                if _grad_enabled() and any(args[i].requires_grad for i in tpos):
                    _mode.grad = True
                    out = _Eager.apply(op, sig, *args)  # the op's own autograd, minus its Python layers
                else:
                    out = op.forward_direct(sig, tpos, args)
                return out[0] if single[0] else out
        return general(*args)

    entry = call
    # only a C++ function: a Python one (or an aot op) would see torch tensors outside the bridge's frame
    native = isinstance(op.fn, types.BuiltinFunctionType) or type(op.fn).__name__ == "nb_func"  # pybind11, nanobind
    if native and _torch_bridge.enabled():
        bridged: List[Any] = [None]  # the C++ bridge's Op, once the bridge is loaded

        def entry(*args: Any) -> Any:
            # eager calls go to the C++ bridge (include/opbuilder/torch_bridge.cpp), which calls the
            # operator itself for plain CPU tensors and `call` for everything else
            if not _is_compiling():
                fast = bridged[0]
                if fast is None:
                    bridge = _torch_bridge.ready()  # starts its build; None until it is loaded
                    if bridge is None:
                        return call(*args)
                    fast = bridged[0] = bridge.Op(op.fn, call, op.by_sig, "cuda" in op.devices)
                return fast(*args)
            return call(*args)

        entry.bridged = bridged  # type: ignore[attr-defined]  # tests read the Op's fast_calls
    entry.__name__ = entry.__qualname__ = op.name
    entry.__doc__ = op.fn.__doc__
    return entry


def _refuse_tangents(name: str, args: Sequence[Any]) -> None:
    """An error if an argument is a dual tensor: operators have no forward-mode formula, and running
    one on the primal alone would return a result without the tangent the caller asked for."""
    for k, a in enumerate(args):
        for t in (a if isinstance(a, (list, tuple)) else [a]):
            if isinstance(t, torch.Tensor) and _forward_ad.unpack_dual(t).tangent is not None:
                raise NotImplementedError(
                    f"{name}: argument {k} is a dual tensor (torch.autograd.forward_ad), but opbuilder operators "
                    f"have no forward-mode derivative; use reverse mode (backward or torch.autograd.grad)")


def _specs(keys: Sequence[Any], sig: str) -> list:
    """The shape rule's arguments: each tensor's (shape, dtype name) as a ``Spec``."""
    def spec(k: Any) -> Spec:
        return Spec(k[0], _dtypes.to_dtype(k[1]).np)  # "bfloat16" is no numpy name
    return [spec(k) if c == "t" else [spec(e) for e in k] if c == "L" else k for k, c in zip(keys, sig)]


def _spec_key(a: Any, c: str) -> Any:
    """A constant stand-in for one argument: (shape, dtype name) for tensors, the value otherwise."""
    if c == "t":
        return (tuple(a.shape), str(a.dtype)[6:])
    if c == "L":
        return tuple((tuple(t.shape), str(t.dtype)[6:]) for t in a)
    return tuple(a) if c in "IF" else a


def to_torch(module: Any, shape_fn: Optional[Dict[str, Callable]] = None, backend: str = "CPU"
             ) -> types.SimpleNamespace:
    """``module``'s functions as PyTorch operators (torch tensors in and out, differentiable).

    ``shape_fn`` maps a function name to its shape rule (see ``Spec``); with one, the operator has a
    fake kernel and works under ``torch.compile(fullgraph=True)``. A function without one takes the
    rule of its ``<name>_infer_shape`` companion (a C++ ``InferShape``) when the module binds one. ``backend`` is the module's
    (``"CPU"`` or ``"GPU"``): which torch devices its arguments may live on.
    """
    if backend not in ("CPU", "GPU"):
        raise ValueError(f"to_torch: backend must be 'CPU' or 'GPU', got {backend!r}")
    funcs = module_functions(module)
    shape_fns = companion_shape_fns(module, funcs, check_shape_fns("to_torch", funcs, shape_fn))
    base = "".join(c if c.isalnum() else "_" for c in getattr(module, "__name__", "module").split(".")[-1])
    ns = f"opbuilder_{base}_{next(_namespaces)}"
    lib = torch.library.Library(ns, "FRAGMENT")
    devices = ("cpu",) if backend == "CPU" else ("cuda", "cpu")
    out = types.SimpleNamespace(_library=lib, _namespace=ns)
    for name, fn in funcs.items():
        setattr(out, name, _wrapper(_Op(ns, lib, name, fn, shape_fns.get(name), devices)))
    return out
