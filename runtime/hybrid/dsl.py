"""The hybrid DSL's vocabulary: value types, promotion, intrinsics, loop kinds, dtype names.

One table serves both targets: the C++ generator reads each intrinsic's
result-type rule and C++ spelling, the Python target its numpy function, and
both call :func:`result_of` for the type, so the two targets agree on every
result dtype by construction. Promotion is numpy's own (``np.result_type``)
with Python numbers "weak" as in NEP 50: ``x[i] * 2.0`` keeps a float16
``x`` in float16, as the Python target computes it.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, NamedTuple, Optional, Sequence, Tuple

import numpy as np

__all__ = ["VType", "DTYPES", "CTYPES", "LOOPS", "INTRINSICS", "CASTS", "Intrinsic", "promote", "result_of",
           "strong", "value_type", "dtype_name"]

DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")
CTYPES = {"float16": "_Float16", "float32": "float", "float64": "double", "int8": "int8_t", "int16": "int16_t",
          "int32": "int32_t", "int64": "int64_t", "uint8": "uint8_t", "bool": "bool"}
# loop kinds: range and MindSpore's scheduling hints (all are loops over range(...)); grid walks a shape
LOOPS = ("range", "serial", "parallel", "vectorize", "reduce", "unroll")
GRID = "grid"
DECLS = ("output_tensor", "allocate")


class VType(NamedTuple):
    """The type of a DSL value: a dtype name, and whether it is a Python number (weak, as in NEP 50)."""

    dtype: str
    weak: bool = False

    @property
    def kind(self) -> str:
        return np.dtype(self.dtype).kind  # 'f', 'i', 'u', 'b'


def dtype_name(value: Any) -> Optional[str]:
    """A DSL dtype name from a numpy dtype, a string, or a cast intrinsic; None if it is none of them."""
    if isinstance(value, Intrinsic) and value.name in CASTS:
        return CASTS[value.name]
    if isinstance(value, str) and value in ("bool_",):
        return "bool"
    try:
        name = np.dtype(value).name
    except TypeError:
        return None
    return name if name in DTYPES else None


def _sample(t: VType) -> Any:
    """What np.result_type is given for ``t``: a Python number when weak, else the dtype."""
    if t.weak:
        return {"i": 1, "f": 1.0, "b": True}[t.kind]
    return np.dtype(t.dtype)


def promote(*ts: VType) -> VType:
    """numpy's result type of an arithmetic op on values of these types (weak if all are)."""
    dt = np.result_type(*[_sample(t) for t in ts]).name
    return VType(dt, all(t.weak for t in ts))


def strong(t: VType) -> VType:
    return VType(t.dtype, False)


def value_type(v: Any) -> VType:
    """The VType of a Python-target value (a numpy scalar, a Python number, a 0-d array)."""
    if isinstance(v, (bool, np.bool_)):
        return VType("bool")
    if isinstance(v, np.generic):  # before float: np.float64 is a subclass of Python's float, yet not weak
        return VType(v.dtype.name)
    if isinstance(v, int):
        return VType("int64", True)
    if isinstance(v, float):
        return VType("float64", True)
    return VType(np.asarray(v).dtype.name)


def _float_of(t: VType) -> VType:
    return VType(t.dtype if t.kind == "f" and not t.weak else "float64")


# result-type rules, each from the argument types
def _rule_float(ts: Sequence[VType]) -> VType:
    return _float_of(ts[0])


def _rule_same(ts: Sequence[VType]) -> VType:
    return strong(ts[0]) if ts[0].dtype != "bool" else VType("int64") if ts[0].weak else ts[0]


def _rule_promote(ts: Sequence[VType]) -> VType:
    return strong(promote(*ts))


def _rule_float2(ts: Sequence[VType]) -> VType:
    return _float_of(promote(*ts))


def _rule_bool(ts: Sequence[VType]) -> VType:
    return VType("bool")


class Intrinsic:
    """One DSL function: its arity, result-type rule, C++ spelling (``{0}`` ... the arguments, already in
    the compute type) and numpy implementation."""

    def __init__(self, name: str, arity: Tuple[int, int], rule: Callable[[Sequence[VType]], VType], cxx: str,
                 py: Callable[..., Any]) -> None:
        self.name, self.arity, self.rule, self.cxx, self.py = name, arity, rule, cxx, py

    def __call__(self, *args: Any) -> Any:  # the Python target
        ts = [value_type(a) for a in args]
        t = result_of(self, ts)
        if self.rule in (_rule_float, _rule_float2, _rule_promote) and not t.weak:
            # computed in the result type, as the C++ does (numpy would compute sin of an int8 in float16)
            args = tuple(np.dtype(t.dtype).type(a) for a in args)
        elif self.rule is _rule_same and ts[0].kind in "iub" and self.name not in ("abs", "sign"):
            return np.dtype(t.dtype).type(args[0])  # floor/ceil/trunc/round of an int: the int itself
        out = self.py(*args)
        return out if t.weak else np.dtype(t.dtype).type(out)

    def __repr__(self) -> str:
        return f"<hybrid intrinsic {self.name}>"


def result_of(fn: Intrinsic, ts: Sequence[VType]) -> VType:
    return fn.rule(ts)


def _erf(x: Any) -> float:
    return math.erf(float(x))


def _rsqrt(x: Any) -> Any:
    return 1.0 / np.sqrt(np.float64(x)) if isinstance(x, (int, float)) else 1 / np.sqrt(x)


def _fmax(*xs: Any) -> Any:
    """NaN-propagating max folded from the right, as ob::max: of two equal values (0.0, -0.0) the second,
    as numpy's float32/float64 maximum loops give (its float16 loop gives the first)."""
    out = xs[-1]
    for x in reversed(xs[:-1]):
        out = x if (x > out or x != x) else out
    return out


def _fmin(*xs: Any) -> Any:
    out = xs[-1]
    for x in reversed(xs[:-1]):
        out = x if (x < out or x != x) else out
    return out


_FLOAT_UNARY = {
    "sqrt": np.sqrt, "exp": np.exp, "log": np.log, "sin": np.sin, "cos": np.cos, "tan": np.tan, "tanh": np.tanh,
    "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh,
    "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh, "log1p": np.log1p, "expm1": np.expm1,
    "exp2": np.exp2, "log2": np.log2, "log10": np.log10,
}

INTRINSICS: Dict[str, Intrinsic] = {}
for _n, _f in _FLOAT_UNARY.items():
    INTRINSICS[_n] = Intrinsic(_n, (1, 1), _rule_float, f"std::{_n}({{0}})", _f)
INTRINSICS["erf"] = Intrinsic("erf", (1, 1), _rule_float, "std::erf({0})", _erf)
INTRINSICS["rsqrt"] = Intrinsic("rsqrt", (1, 1), _rule_float, "ob::rsqrt({0})", _rsqrt)
for _n, _f in {"floor": np.floor, "ceil": np.ceil, "trunc": np.trunc, "round": np.rint}.items():
    _c = "nearbyint" if _n == "round" else _n
    INTRINSICS[_n] = Intrinsic(_n, (1, 1), _rule_same, f"ob::{_c}({{0}})", _f)
INTRINSICS["abs"] = Intrinsic("abs", (1, 1), _rule_same, "ob::abs({0})", np.abs)
INTRINSICS["sign"] = Intrinsic("sign", (1, 1), _rule_same, "ob::sign({0})", np.sign)
# numpy's scalar a ** b (np.power's array loops take sqrt for b == 0.5: power(-0.0, 0.5) would be -0.0)
INTRINSICS["power"] = Intrinsic("power", (2, 2), _rule_promote, "ob::power({0}, {1})", lambda a, b: a ** b)
INTRINSICS["max"] = Intrinsic("max", (2, 8), _rule_promote, "ob::max", _fmax)
INTRINSICS["min"] = Intrinsic("min", (2, 8), _rule_promote, "ob::min", _fmin)
INTRINSICS["atan2"] = Intrinsic("atan2", (2, 2), _rule_float2, "std::atan2({0}, {1})", np.arctan2)
INTRINSICS["fmod"] = Intrinsic("fmod", (2, 2), _rule_float2, "std::fmod({0}, {1})", np.fmod)
for _n, _f in {"isnan": np.isnan, "isinf": np.isinf, "isfinite": np.isfinite}.items():
    INTRINSICS[_n] = Intrinsic(_n, (1, 1), _rule_bool, f"ob::{_n}({{0}})", _f)

# casts: float32(x) ...; float(x) and int(x) give Python numbers (weak), as in Python
CASTS = {"float16": "float16", "float32": "float32", "float64": "float64", "int8": "int8", "int16": "int16",
         "int32": "int32", "int64": "int64", "uint8": "uint8", "bool_": "bool"}
for _n, _d in CASTS.items():
    INTRINSICS[_n] = Intrinsic(_n, (1, 1), (lambda d: lambda ts: VType(d))(_d), "{0}", np.dtype(_d).type)
INTRINSICS["float"] = Intrinsic("float", (1, 1), lambda ts: VType("float64", True), "{0}", float)


def _int(x: Any) -> int:
    """Python's int(), within the DSL's int (an int64): NaN is a ValueError, infinities and values out of
    int64's range an OverflowError (Python's int would grow; the compiled target cannot)."""
    v = int(x)
    if not -2 ** 63 <= v < 2 ** 63:
        raise OverflowError(f"int() of a float out of int64's range (the DSL's int is an int64): {x!r}")
    return v


INTRINSICS["int"] = Intrinsic("int", (1, 1), lambda ts: VType("int64", True), "{0}", _int)
