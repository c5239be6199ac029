"""Data types of runtime tensors: named objects over numpy dtypes.

MindSpore prints dtypes as ``Float32``; users write ``runtime.float32``. Each
``DType`` maps one-to-one onto a numpy dtype, which is what the data really is.
``bfloat16`` is ml_dtypes' numpy type; ml_dtypes is imported on the first use
of ``bfloat16.np`` (or of a bf16 array), not by ``import runtime``.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import numpy as np

__all__ = [
    "DType", "float16", "bfloat16", "float32", "float64", "complex64", "complex128", "int8", "int16",
    "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool_", "to_dtype", "from_numpy_dtype",
    "SUPPORTED", "GRAD_KINDS",
]

# numpy dtype kinds gradients flow through: real floats, complex, and "V" for bfloat16 (ml_dtypes'
# kind; no other "V" dtype can be a tensor's, from_numpy_dtype refuses them)
GRAD_KINDS = "fcV"


def _bfloat16_np() -> np.dtype:
    import ml_dtypes  # lazily: only bf16 tensors need it
    return np.dtype(ml_dtypes.bfloat16)


class DType:
    """A tensor element type. Compare with ``==``; ``.np`` is the numpy dtype.

    ``is_floating``: real floating point (float16/bfloat16/float32/float64);
    ``is_complex``: complex64/complex128. Both are differentiable."""

    __slots__ = ("name", "np", "is_floating", "is_complex", "_display", "_load")

    def __init__(self, name: str, np_dtype: Any, display: str, kind: str = "",
                 load: Optional[Callable[[], np.dtype]] = None) -> None:
        self.name = name
        self._load = load
        if load is None:  # else `np` stays unset until __getattr__ loads it
            self.np = np.dtype(np_dtype)
            kind = self.np.kind
        self.is_floating = kind == "f"
        self.is_complex = kind == "c"
        self._display = display

    def __getattr__(self, attr: str) -> Any:
        """Called only for an unset slot: ``np`` of a lazily loaded dtype (bfloat16)."""
        if attr == "np" and self._load is not None:
            d = self._load()
            self.np = d
            _BY_NP[d] = self
            return d
        raise AttributeError(attr)

    def __repr__(self) -> str:
        return self._display

    __str__ = __repr__

    def __reduce__(self):
        return (to_dtype, (self.name,))


float16 = DType("float16", np.float16, "Float16")
bfloat16 = DType("bfloat16", None, "BFloat16", kind="f", load=_bfloat16_np)
float32 = DType("float32", np.float32, "Float32")
float64 = DType("float64", np.float64, "Float64")
complex64 = DType("complex64", np.complex64, "Complex64")
complex128 = DType("complex128", np.complex128, "Complex128")
int8 = DType("int8", np.int8, "Int8")
int16 = DType("int16", np.int16, "Int16")
int32 = DType("int32", np.int32, "Int32")
int64 = DType("int64", np.int64, "Int64")
uint8 = DType("uint8", np.uint8, "UInt8")
uint16 = DType("uint16", np.uint16, "UInt16")
uint32 = DType("uint32", np.uint32, "UInt32")
uint64 = DType("uint64", np.uint64, "UInt64")
bool_ = DType("bool", np.bool_, "Bool")

SUPPORTED = (float16, bfloat16, float32, float64, complex64, complex128, int8, int16, int32, int64,
             uint8, uint16, uint32, uint64, bool_)
_BY_NP: Dict[np.dtype, DType] = {d.np: d for d in SUPPORTED if d._load is None}
_BY_NAME: Dict[str, DType] = {d.name: d for d in SUPPORTED}
_BY_NAME["bool_"] = bool_


def _supported_names() -> str:
    return ", ".join(d.name for d in SUPPORTED)


def from_numpy_dtype(np_dtype: np.dtype) -> DType:
    """The DType of a numpy dtype; TypeError for dtypes tensors cannot hold."""
    try:
        return _BY_NP[np_dtype]
    except KeyError:
        pass
    d = np.dtype(np_dtype)
    if d in _BY_NP and d.isnative:
        return _BY_NP[d]
    if d.kind == "V" and d.name == "bfloat16" and d == bfloat16.np:  # first bf16 array: registers it
        return bfloat16
    raise TypeError(f"unsupported tensor dtype {d}; supported: {_supported_names()}")


def to_dtype(value: Any) -> DType:
    """Accept a DType, its name ('float32'), or anything numpy reads as a dtype."""
    if isinstance(value, DType):
        return value
    if isinstance(value, str) and value in _BY_NAME:
        return _BY_NAME[value]
    try:
        d = np.dtype(value)
    except TypeError:
        raise TypeError(f"not a dtype: {value!r}; supported: {_supported_names()}") from None
    return from_numpy_dtype(d)
