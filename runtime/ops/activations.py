"""Activations and clipping for training: ``clip`` (``clamp``) and ``gelu``.

Each forward sits beside its derivative rule, as in math.py; the rules are
written with runtime ops, so they are differentiable again.
"""
from __future__ import annotations

import math as _pymath
from typing import Any, Optional

import numpy as np

from .. import device as _device
from ..tensor import Tensor
from .math import _one, _pair, add, cast, exp, greater, greater_equal, less, less_equal, mul, tanh, where
from .primitive import Primitive, defvjp

__all__ = ["clip", "clamp", "gelu"]


def _float(x: Tensor, what: str) -> None:
    if x._data.dtype.kind not in "fV":  # real floats and bfloat16
        raise TypeError(f"{what} needs a floating-point tensor, got {x.dtype}; cast it first")


# ---- clip ----------------------------------------------------------------------------
def _clip_np(x: np.ndarray, lo: Optional[float], hi: Optional[float]) -> np.ndarray:
    out = x  # the bounds as scalars of x's dtype (CuPy takes scalars, not 0-d numpy arrays)
    if lo is not None:
        out = np.maximum(out, x.dtype.type(lo))
    if hi is not None:
        out = np.minimum(out, x.dtype.type(hi))
    return x.view() if out is x else out  # no bounds: a view of x (a Primitive's result is never x itself)


def _clip_vjp(g: Tensor, ans: Tensor, x: Tensor, lo: Optional[float], hi: Optional[float]) -> Tensor:
    """g where lo <= x <= hi, else 0 (NaN: 0). With runtime ops, not a numpy mask: under jit the rule is
    traced once and replayed, and a mask of this call's values would be replayed as a constant."""
    if lo is not None:
        g = where(greater_equal(x, lo), g, 0)
    if hi is not None:
        g = where(less_equal(x, hi), g, 0)
    return g


_clip = Primitive("clip", _clip_np)
defvjp(_clip, _clip_vjp, reads_output=False, reads_inputs=(0,))

# Tensor bounds, torch's clamp rules: the input gets the gradient where min <= x <= max (NaN: none), min where
# x < min (and min < max), max where x > max or max < min (max wins). A NaN bound makes the result NaN.
_clamp_min = Primitive("clamp_min", lambda x, lo: np.maximum(x, lo))
defvjp(_clamp_min, lambda g, ans, x, lo: where(greater_equal(x, lo), g, 0),
       lambda g, ans, x, lo: where(less(x, lo), g, 0), reads_output=False, reads_inputs=(0, 1))
_clamp_max = Primitive("clamp_max", lambda x, hi: np.minimum(x, hi))
defvjp(_clamp_max, lambda g, ans, x, hi: where(less_equal(x, hi), g, 0),
       lambda g, ans, x, hi: where(greater(x, hi), g, 0), reads_output=False, reads_inputs=(0, 1))
_clamp = Primitive("clamp", lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi))
defvjp(_clamp,
       lambda g, ans, x, lo, hi: where(greater_equal(x, lo), where(less_equal(x, hi), g, 0), 0),
       lambda g, ans, x, lo, hi: where(less(x, lo), where(less(lo, hi), g, 0), 0),
       lambda g, ans, x, lo, hi: where(greater(x, hi), g, where(less(hi, lo), g, 0)),
       reads_output=False, reads_inputs=(0, 1, 2))


def _bound(v: Any, what: str) -> Optional[float]:
    if v is None or isinstance(v, Tensor):
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"clip: {what} must be a number, a Tensor or None, got {type(v).__name__}")
    return v


def clip(input: Any, min: Any = None, max: Any = None) -> Tensor:  # noqa: A001,A002
    """``input`` limited to [min, max]; the gradient passes where min <= input <= max.

    Number bounds are constants; Tensor bounds broadcast and are differentiable: a bound gets the
    gradient where it is the result (input below min, above max), the input where it lies between
    them, ties included, as torch's clamp. min > max gives max everywhere (MindSpore's and torch's
    rule). An integer input with a float bound is clipped as float32, as torch does.
    """
    x = _one(input)
    lo, hi = _bound(min, "min"), _bound(max, "max")
    if lo is None and hi is None:
        raise ValueError("clip: at least one of min and max must be given")
    if x._data.dtype.kind in "biu" and any(isinstance(b, (float, np.floating)) for b in (lo, hi)):
        x = cast(x, "float32")
    if isinstance(lo, Tensor) or isinstance(hi, Tensor):
        if lo is None:
            return _clamp_max(*_pair(x, hi))
        if hi is None:
            return _clamp_min(*_pair(x, lo))
        x, lo = _pair(x, lo)
        x, hi = _pair(x, hi)
        lo, hi = _pair(lo, hi)
        return _clamp(x, lo, hi)
    return _clip(x, lo=lo, hi=hi)


clamp = clip


# ---- gelu ------------------------------------------------------------------------------
_SQRT_2_OVER_PI = _pymath.sqrt(2.0 / _pymath.pi)
_erf_host = np.frompyfunc(_pymath.erf, 1, 1)


def _erf(x: np.ndarray) -> np.ndarray:
    """erf elementwise in x's dtype: Python's math.erf on the host; on a GPU CuPy's
    ``cupyx.scipy.special.erf`` (a frompyfunc ufunc has no CuPy counterpart)."""
    if isinstance(x, np.ndarray):
        return _erf_host(x).astype(x.dtype)
    from cupyx.scipy.special import erf
    return erf(x).astype(x.dtype, copy=False)


def _gelu_exact_np(x: np.ndarray) -> np.ndarray:
    return (0.5 * x * (1.0 + _erf(x / _pymath.sqrt(2.0)))).astype(x.dtype, copy=False)


def _pdf(x: Tensor) -> Tensor:
    """The standard normal density, with runtime ops (differentiable again)."""
    return mul(exp(mul(mul(x, x), -0.5)), 1.0 / _pymath.sqrt(2.0 * _pymath.pi))


# the standard normal CDF (erf has no runtime op); its rule, the density, uses runtime ops, so gelu's
# derivative, cdf(x) + x pdf(x), is differentiable to any order (it was numpy: a second derivative was 0)
_cdf = Primitive("normal_cdf", lambda x: (0.5 * (1.0 + _erf(x / _pymath.sqrt(2.0)))).astype(x.dtype, copy=False))
defvjp(_cdf, lambda g, ans, x: mul(g, _pdf(x)), reads_output=False, reads_inputs=(0,))


def _gelu_exact_vjp(g: Tensor, ans: Tensor, x: Tensor) -> Tensor:
    return mul(g, add(_cdf(x), mul(x, _pdf(x))))


_gelu_exact = Primitive("gelu", _gelu_exact_np)
defvjp(_gelu_exact, _gelu_exact_vjp, reads_output=False, reads_inputs=(0,))


def gelu(input_x: Any, approximate: str = "none") -> Tensor:
    """GELU: x * Phi(x) (``approximate="none"``, through erf) or its tanh form (``"tanh"``)."""
    x = _one(input_x)
    _float(x, "gelu")
    if approximate == "tanh":
        inner = mul(add(x, mul(mul(mul(x, x), x), 0.044715)), _SQRT_2_OVER_PI)
        return mul(mul(x, 0.5), add(tanh(inner), 1.0))
    if approximate != "none":
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _gelu_exact(x)
