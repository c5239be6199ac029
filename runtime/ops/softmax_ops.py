"""The softmax family: ``softmax``, ``log_softmax`` and ``logsumexp``.

Each forward sits beside its derivative rule, as in math.py. The forwards
subtract the maximum before ``exp`` so large logits do not overflow; the
rules are written with runtime ops, so they are differentiable again.
"""
from __future__ import annotations

from typing import Any, Sequence, Union

import numpy as np

from ..tensor import Tensor
from .math import _norm_axis, _one, exp, mul, reshape, sub, sum as _sum
from .primitive import Primitive, defvjp

__all__ = ["softmax", "log_softmax", "logsumexp"]


def _float(x: Tensor, what: str) -> None:
    if x._data.dtype.kind not in "fV":  # real floats and bfloat16
        raise TypeError(f"{what} needs a floating-point tensor, got {x.dtype}; cast it first")


def _int_axis(axis: Any, what: str) -> int:
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{what}: axis must be an int, got {type(axis).__name__}")
    return int(axis)


# ---- softmax -------------------------------------------------------------------
def _softmax_np(x: np.ndarray, axis: int) -> np.ndarray:
    if x.size == 0:  # numpy's max has no identity: an empty axis would be an error
        return x.copy()
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


_softmax = Primitive("softmax", _softmax_np)
defvjp(_softmax, lambda g, ans, x, axis: mul(ans, sub(g, _sum(mul(g, ans), axis=axis, keepdims=True))),
       reads_output=True, reads_inputs=())


def softmax(x: Any, axis: int = -1) -> Tensor:
    """exp(x) / sum(exp(x)) along ``axis`` (computed stably); floating-point tensors only."""
    x = _one(x)
    if x._data.dtype.kind not in "fV":  # real floats and bfloat16
        raise TypeError(f"softmax needs a floating-point tensor, got {x.dtype}; cast it first")
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"softmax: axis must be an int, got {type(axis).__name__}")
    ax = _norm_axis(axis, max(x.ndim, 1))  # a 0-d tensor takes axis 0 or -1, as log_softmax
    assert ax is not None
    if x.ndim == 0:
        return _softmax(reshape(x, (1,)), axis=0).reshape(())
    return _softmax(x, axis=ax[0])


# ---- log_softmax ------------------------------------------------------------------
def _log_softmax_np(x: np.ndarray, axis: int) -> np.ndarray:
    if x.size == 0:  # numpy's max has no identity: an empty axis would be an error
        return x.copy()
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


_log_softmax = Primitive("log_softmax", _log_softmax_np)
# d/dx: g - softmax(x) * sum(g); softmax(x) is exp(ans)
defvjp(_log_softmax, lambda g, ans, x, axis: sub(g, mul(exp(ans), _sum(g, axis=axis, keepdims=True))),
       reads_output=True, reads_inputs=())


def log_softmax(logits: Any, axis: int = -1) -> Tensor:
    """log(softmax(logits)) along ``axis``, computed without overflow."""
    x = _one(logits)
    _float(x, "log_softmax")
    ax = _norm_axis(_int_axis(axis, "log_softmax"), max(x.ndim, 1))  # a 0-d tensor takes axis 0 or -1
    assert ax is not None
    if x.ndim == 0:
        return reshape(_log_softmax(reshape(x, (1,)), axis=0), ())
    return _log_softmax(x, axis=ax[0])


# ---- logsumexp ----------------------------------------------------------------------
def _logsumexp_np(x: np.ndarray, axis: tuple, keepdims: bool) -> np.ndarray:
    if x.size == 0:
        return np.log(np.sum(np.exp(x), axis=axis, keepdims=keepdims))  # -inf, as log(0)
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis)


def _logsumexp_vjp(g: Tensor, ans: Tensor, x: Tensor, axis: tuple, keepdims: bool) -> Tensor:
    if not keepdims:
        kept = tuple(1 if i in axis else s for i, s in enumerate(x.shape))
        g, ans = reshape(g, kept), reshape(ans, kept)
    return mul(g, exp(sub(x, ans)))  # g * softmax(x)


_logsumexp = Primitive("logsumexp", _logsumexp_np)
defvjp(_logsumexp, _logsumexp_vjp, reads_output=True, reads_inputs=(0,))


def logsumexp(input: Any, axis: Union[int, Sequence[int]], keep_dims: bool = False) -> Tensor:  # noqa: A002
    """log(sum(exp(input))) over ``axis`` (an int or a tuple of ints), computed without overflow."""
    x = _one(input)
    _float(x, "logsumexp")
    if not isinstance(keep_dims, (bool, np.bool_)):
        raise TypeError(f"logsumexp: keep_dims must be a bool, got {type(keep_dims).__name__}")
    axes = _norm_axis(axis, x.ndim)
    if axes is None:
        raise TypeError("logsumexp: axis must be an int or a tuple of ints, got None")
    if x.ndim == 0:
        return reshape(x, ())  # a scalar is its own logsumexp
    return _logsumexp(x, axis=tuple(sorted(set(axes))), keepdims=bool(keep_dims))
