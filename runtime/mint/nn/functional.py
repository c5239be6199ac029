"""``runtime.mint.nn.functional``: activations under MindSpore mint's names and signatures."""
from __future__ import annotations

from typing import Any, Optional

from ...ops import math as _m
from ...ops import softmax_ops as _sm
from ...tensor import Tensor

__all__ = ["relu", "sigmoid", "tanh", "softmax"]


def relu(input: Any, inplace: bool = False) -> Tensor:  # noqa: A002  (MindSpore's parameter names)
    """max(input, 0). ``inplace=True`` is not supported: tensors here change only through ops that say so."""
    if inplace:
        raise ValueError("relu(inplace=True) is not supported; use the returned tensor")
    return _m.relu(input)


def sigmoid(input: Any) -> Tensor:  # noqa: A002
    """1 / (1 + exp(-input))."""
    return _m.sigmoid(input)


def tanh(input: Any) -> Tensor:  # noqa: A002
    """Hyperbolic tangent."""
    return _m.tanh(input)


def softmax(input: Any, dim: Optional[int] = None, dtype: Any = None) -> Tensor:  # noqa: A002
    """exp / sum(exp) along ``dim`` (the last dim when None); ``dtype`` casts the input first."""
    x = _m._one(input)
    if dtype is not None:
        x = _m.cast(x, dtype)
    return _sm.softmax(x, -1 if dim is None else dim)
