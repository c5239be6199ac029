"""Host arrays of other frameworks' tensors that numpy's DLPack cannot read (bfloat16).

numpy's ``from_dlpack`` refuses DLPack's bfloat16 (type code 4). The producer's
own conversion still shares the memory: a torch CPU tensor viewed as uint16 then
as ml_dtypes' bfloat16, a JAX CPU array through ``np.asarray`` (read-only).
``host_array`` picks that way for torch and JAX and DLPack otherwise;
``dlpack_dtype_name`` names the dtype of a capsule numpy refused, for the error.
``torch_write_refusal`` says when torch forbids an operator called straight on
a torch tensor to write it (and every torch route words its refusals here).
Neither torch nor JAX is imported here: a tensor of theirs means they are.
"""
from __future__ import annotations

import sys
from typing import Any, Optional

import numpy as np

from . import dtypes as _dt

__all__ = ["host_array", "torch_array", "TorchVersion", "dlpack_dtype_name", "resolved_view_write_message",
           "inference_write_message", "grad_write_message", "torch_write_refusal", "RefusedWrite",
           "foreign_write_refusal"]

# DLPack's DLDataTypeCode names (dlpack.h, v1.1)
_CODES = {0: "int", 1: "uint", 2: "float", 3: "opaque handle", 4: "bfloat", 5: "complex", 6: "bool",
          7: "float8_e3m4", 8: "float8_e4m3", 9: "float8_e4m3b11fnuz", 10: "float8_e4m3fn",
          11: "float8_e4m3fnuz", 12: "float8_e5m2", 13: "float8_e5m2fnuz", 14: "float8_e8m0fnu",
          15: "float6_e2m3fn", 16: "float6_e3m2fn", 17: "float4_e2m1fn"}


def _module(obj: Any) -> str:
    return type(obj).__module__.partition(".")[0]


def torch_array(t: Any) -> np.ndarray:
    """The numpy view of a CPU torch tensor, bfloat16 included (through a uint16 view). One that requires
    grad is detached first (one memory, one version counter): torch's ``numpy()`` refuses it."""
    torch = sys.modules["torch"]
    if t.requires_grad:
        t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.uint16).numpy().view(_dt.bfloat16.np)
    return t.numpy()


class TorchVersion:
    """A runtime tensor's version counter that is a torch tensor's (one memory, one counter, torch's
    rule): reads give torch's ``_version``; a runtime write (an op's MarkDirty, a write its checks
    found) bumps torch's, so torch's autograd refuses a saved tensor the op changed. For a torch
    tensor an op takes through ``runtime.interop.dlpack_input`` (a subclass: the C exchange table,
    which bumps torch's counter itself, takes only torch's own types)."""

    __slots__ = ("t", "off")

    def __init__(self, t: Any) -> None:
        self.t = t  # detached when it required grad: the same counter
        self.off = 0

    @property
    def value(self) -> int:
        return self.t._version + self.off

    @value.setter
    def value(self, v: int) -> None:
        bump = sys.modules["torch"]._C._increment_version
        n = v - self.value
        for _ in range(n):
            bump((self.t,))
        if n < 0:
            self.off += n


def resolved_view_write_message(who: str, index: int, t: Any, how: str = "MarkDirty") -> str:
    """Why ``who`` may not write argument ``index``, a torch view with the negative or conjugate bit set:
    an operator gets such a view as a resolved copy (numpy and DLPack have no such bit), so the write
    would not reach it. Every torch route says it in these words."""
    kind = "negative" if t.is_neg() else "conjugate"
    return (f"{who} modifies argument {index} in place ({how}), but it is a {kind} view (z.conj(), "
            f"z.conj().imag, torch._neg_view), which an operator gets as a resolved copy: the write would not "
            f"reach it. Write into a resolved tensor instead (x.resolve_neg(), x.resolve_conj() or x.clone()); "
            f"the argument is unchanged")


def inference_write_message(who: str, index: int, how: str = "MarkDirty") -> str:
    """torch's refusal of an in-place update to an inference tensor outside InferenceMode, for ``who``."""
    return (f"{who} modifies argument {index} in place ({how}), but it is an inference tensor (made under "
            f"torch.inference_mode()) and inference mode is off: torch allows no in-place update to an inference "
            f"tensor outside InferenceMode. Write into a clone (x.clone()), or call it under "
            f"torch.inference_mode(); the argument is unchanged")


def grad_write_message(who: str, index: int, t: Any, how: str = "MarkDirty") -> str:
    """Why ``who``, called straight on torch tensors (no ``opbuilder.to_torch``), may not write argument
    ``index``: it requires grad (or is a view of a tensor that does) and torch's grad mode is on. Such a
    call records nothing in torch's graph, so torch's gradient would miss the write."""
    what = "requires grad" if t.requires_grad else "is a view of a tensor that requires grad"
    return (f"{who} modifies argument {index} in place ({how}), but it is a torch tensor that {what}, and an "
            f"operator called on torch tensors directly records nothing in torch's autograd graph, so torch's "
            f"gradient would miss the write. Call it through opbuilder.to_torch(module), or under "
            f"torch.no_grad(); the argument is unchanged")


def torch_write_refusal(t: Any, who: str, index: int, how: str = "MarkDirty") -> Optional[str]:
    """Why an operator called straight on torch tensors (the DLPack route) may not write the torch tensor
    ``t`` (its argument ``index``) in place now, in torch's rule, or None when it may: a conjugate or
    negative view (the operator got a resolved copy); an inference tensor outside InferenceMode; while
    torch's grad mode is on, a tensor that requires grad or a view of one (not recorded on this route)."""
    if t.is_neg() or t.is_conj():
        return resolved_view_write_message(who, index, t, how)
    torch = sys.modules["torch"]
    if t.is_inference() and not torch.is_inference_mode_enabled():
        return inference_write_message(who, index, how)
    if torch.is_grad_enabled() and (t.requires_grad or (t._is_view() and t._base.requires_grad)):
        return grad_write_message(who, index, t, how)
    return None


class RefusedWrite:
    """The version counter of a runtime tensor over a private copy of a torch tensor that the operator
    may not write now (``torch_write_refusal``: a conjugate or negative view, an inference tensor outside
    InferenceMode, one that requires grad while grad mode is on): ``t`` is the caller's tensor, for the
    refusal's words. The copy is read-only memory; a write reaches only it (or the op's private copy of
    it), and the C++ operator raises the refusal (its name and the argument's index,
    ``foreign_write_refusal``) before anything is written back."""

    __slots__ = ("t", "value")

    def __init__(self, t: Any) -> None:
        self.t = t
        self.value = 0


def foreign_write_refusal(obj: Any, who: str, index: int) -> Optional[str]:
    """Why the C++ operator ``who`` may not write its argument ``index`` now: ``obj`` is the torch tensor it
    took straight through DLPack's C exchange table, or the runtime tensor ``runtime.interop.dlpack_input``
    made (a ``RefusedWrite`` counter names the torch tensor it stands for). None when it may (include/
    opbuilder/detail/call_rules.h ForeignRefusal asks, before Forward for a type that may write)."""
    vc = getattr(obj, "_vc", None)
    if type(vc) is RefusedWrite:
        return torch_write_refusal(vc.t, who, index) or (
            f"{who} modifies argument {index} in place (MarkDirty), but it reached the operator as a copy of a "
            f"torch tensor (a conjugate or negative view, an inference tensor, or one that requires grad); "
            f"the argument is unchanged")
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(obj, torch.Tensor):
        return None
    return torch_write_refusal(obj, who, index)


def host_array(obj: Any) -> np.ndarray:
    """A numpy array over the memory of ``obj``, a host (CPU) array with ``__dlpack__``."""
    mod = _module(obj)
    if mod == "torch" and obj.is_neg():  # DLPack has no negative bit: its values would arrive negated
        raise BufferError("from_dlpack: a torch tensor with the negative bit set (a lazily negated view, such "
                          "as x.conj().imag) cannot be shared through DLPack; pass x.resolve_neg()")
    if mod == "torch" and getattr(obj, "dtype", None) is sys.modules["torch"].bfloat16:
        return torch_array(obj)
    if mod in ("jax", "jaxlib") and str(getattr(obj, "dtype", "")) == "bfloat16":
        return np.asarray(obj)  # ml_dtypes' bfloat16 over the same buffer, read-only
    try:
        return np.from_dlpack(obj)
    except (BufferError, RuntimeError):  # numpy names no dtype: the capsule does
        name = dlpack_dtype_name(obj)
        if name is None:
            raise
        raise TypeError(f"from_dlpack: {type(obj).__name__} has DLPack dtype {name}, which numpy cannot read "
                        f"(bfloat16 is taken from torch and JAX tensors)") from None


def dlpack_dtype_name(obj: Any) -> Optional[str]:
    """The dtype of ``obj``'s DLPack capsule as DLPack names it ("bfloat16"), None if unreadable."""
    try:
        cap = obj.__dlpack__()
    except Exception:  # noqa: BLE001 - any refusal: nothing to name
        return None
    from .dlpack_capsule import dtype_field  # ctypes: only on this error path
    dt = dtype_field(cap)
    if dt is None:
        return None
    base = _CODES.get(dt.code, f"type code {dt.code}")
    if dt.code in (0, 1, 2, 4, 5):
        base += str(dt.bits)
    return base if dt.lanes == 1 else f"{base}x{dt.lanes}"
