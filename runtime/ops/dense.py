"""``dense(input, weight, bias=None)``: input @ weight.T + bias as one recorded node.

``nn.Dense`` runs on it: one node per layer instead of three (transpose,
matmul, add), which is most of what an MLP step records. The rules use
runtime ops, so the layer is differentiable again.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ..tensor import Tensor
from .math import _one, matmul, reshape, transpose
from .primitive import Primitive, defvjp

__all__ = ["dense"]


def _dense_np(x: np.ndarray, w: np.ndarray, b: Optional[np.ndarray] = None) -> np.ndarray:
    if x.dtype.kind == "V":  # bfloat16: numpy's matmul of it returns float32; computed so, rounded back once
        f32 = np.float32
        return _dense_np(x.astype(f32), w.astype(f32), None if b is None else b.astype(f32)).astype(x.dtype)
    out = np.matmul(x, w.T)
    if b is not None:
        out += b  # out is fresh: add the bias in place
    return out


def _grad_x(g: Tensor, ans: Tensor, x: Tensor, w: Tensor, *b: Tensor) -> Tensor:
    return matmul(g, w)


def _grad_w(g: Tensor, ans: Tensor, x: Tensor, w: Tensor, *b: Tensor) -> Tensor:
    if x.ndim != 2:
        g, x = reshape(g, (-1, w.shape[0])), reshape(x, (-1, w.shape[1]))
    return matmul(transpose(g), x)


def _grad_b(g: Tensor, ans: Tensor, x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    return g  # the engine sums it down to the bias' shape


_dense = Primitive("dense", _dense_np)
defvjp(_dense, _grad_x, _grad_w, reads_output=False, reads_inputs={0: (1,), 1: (0,)})
_dense_bias = Primitive("dense", _dense_np)
defvjp(_dense_bias, _grad_x, _grad_w, _grad_b, reads_output=False, reads_inputs={0: (1,), 1: (0,)})


def dense(input: Any, weight: Any, bias: Any = None) -> Tensor:  # noqa: A002  (MindSpore's names)
    """input (..., in) @ weight (out, in).T (+ bias (out,)) -> (..., out)."""
    x, w = _one(input), _one(weight)
    if w.ndim != 2:
        raise ValueError(f"dense: weight must be 2-D (out, in), got shape {list(w.shape)}")
    if x.ndim < 1 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"dense: input of shape {list(x.shape)} does not match weight of shape "
                         f"{list(w.shape)} (the input's last dim must be {w.shape[1]})")
    if x._data.dtype != w._data.dtype:
        raise TypeError(f"dense: input is {x.dtype} but weight is {w.dtype}; cast one of them")
    if bias is None:
        return _dense(x, w)
    b = _one(bias)
    if b.shape != (w.shape[0],):
        raise ValueError(f"dense: bias must have shape [{w.shape[0]}], got {list(b.shape)}")
    if b._data.dtype != w._data.dtype:
        raise TypeError(f"dense: bias is {b.dtype} but weight is {w.dtype}; cast one of them")
    return _dense_bias(x, w, b)
