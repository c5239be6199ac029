"""Data types of runtime tensors: named objects over numpy dtypes.

MindSpore prints dtypes as ``Float32``; users write ``runtime.float32``. Each
``DType`` maps one-to-one onto a numpy dtype, which is what the data really is.
"""
from __future__ import annotations

from typing import Any, Dict

import numpy as np

__all__ = [
    "DType", "float16", "float32", "float64", "int8", "int16", "int32", "int64",
    "uint8", "bool_", "to_dtype", "from_numpy_dtype", "SUPPORTED",
]


class DType:
    """A tensor element type. Compare with ``==``; ``.np`` is the numpy dtype."""

    __slots__ = ("name", "np", "is_floating", "_display")

    def __init__(self, name: str, np_dtype: Any, display: str) -> None:
        self.name = name
        self.np = np.dtype(np_dtype)
        self.is_floating = self.np.kind == "f"
        self._display = display

    def __repr__(self) -> str:
        return self._display

    __str__ = __repr__

    def __reduce__(self):
        return (to_dtype, (self.name,))


float16 = DType("float16", np.float16, "Float16")
float32 = DType("float32", np.float32, "Float32")
float64 = DType("float64", np.float64, "Float64")
int8 = DType("int8", np.int8, "Int8")
int16 = DType("int16", np.int16, "Int16")
int32 = DType("int32", np.int32, "Int32")
int64 = DType("int64", np.int64, "Int64")
uint8 = DType("uint8", np.uint8, "UInt8")
bool_ = DType("bool", np.bool_, "Bool")

SUPPORTED = (float16, float32, float64, int8, int16, int32, int64, uint8, bool_)
_BY_NP: Dict[np.dtype, DType] = {d.np: d for d in SUPPORTED}
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
