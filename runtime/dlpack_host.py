"""Host arrays of other frameworks' tensors that numpy's DLPack cannot read (bfloat16).

numpy's ``from_dlpack`` refuses DLPack's bfloat16 (type code 4). The producer's
own conversion still shares the memory: a torch CPU tensor viewed as uint16 then
as ml_dtypes' bfloat16, a JAX CPU array through ``np.asarray`` (read-only).
``host_array`` picks that way for torch and JAX and DLPack otherwise;
``dlpack_dtype_name`` names the dtype of a capsule numpy refused, for the error.
Neither torch nor JAX is imported here: a tensor of theirs means they are.
"""
from __future__ import annotations

import sys
from typing import Any, Optional

import numpy as np

from . import dtypes as _dt

__all__ = ["host_array", "torch_array", "TorchVersion", "dlpack_dtype_name"]

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


def host_array(obj: Any) -> np.ndarray:
    """A numpy array over the memory of ``obj``, a host (CPU) array with ``__dlpack__``."""
    mod = _module(obj)
    if mod == "torch" and obj.is_neg():  # DLPack has no negative bit: its values would arrive negated
        raise BufferError(f"from_dlpack: a torch tensor with the negative bit set (a lazily negated view, such "
                          f"as x.conj().imag) cannot be shared through DLPack; pass x.resolve_neg()")
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
