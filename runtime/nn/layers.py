"""Layers (MindSpore's ``nn`` names): ``Dense``, activations, ``Softmax``, ``Flatten``, ``Dropout``.

Each is a small ``Cell`` over the runtime's differentiable ops.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Union

import numpy as np

from .. import device as _device
from .. import dtypes as _dt
from .. import seed as _seed
from ..ops.op_entry import breaks_trace
from ..ops import math as _m
from ..ops.activations import gelu
from ..ops.dense import dense
from ..ops.softmax_ops import softmax
from ..tensor import Parameter, Tensor
from .cell import Cell
from .init import HeUniform, Uniform, initializer

__all__ = ["Dense", "ReLU", "Tanh", "Sigmoid", "GELU", "Softmax", "Flatten", "Dropout", "get_activation"]


class ReLU(Cell):
    """max(x, 0)."""

    def construct(self, x: Tensor) -> Tensor:
        return _m.relu(x)


class Tanh(Cell):
    def construct(self, x: Tensor) -> Tensor:
        return _m.tanh(x)


class Sigmoid(Cell):
    def construct(self, x: Tensor) -> Tensor:
        return _m.sigmoid(x)


class GELU(Cell):
    """GELU; ``approximate=True`` (MindSpore's default) is the tanh form, False the erf form."""

    def __init__(self, approximate: bool = True) -> None:
        super().__init__()
        self.approximate = "tanh" if approximate else "none"

    def construct(self, x: Tensor) -> Tensor:
        return gelu(x, approximate=self.approximate)


class Softmax(Cell):
    def __init__(self, axis: int = -1) -> None:
        super().__init__()
        self.axis = axis

    def construct(self, x: Tensor) -> Tensor:
        return softmax(x, self.axis)


_ACTIVATIONS = {"relu": ReLU, "tanh": Tanh, "sigmoid": Sigmoid, "gelu": GELU, "softmax": Softmax}


def get_activation(name: str) -> Cell:
    """The activation cell called ``name`` ('relu', 'tanh', 'sigmoid', 'gelu', 'softmax')."""
    cls = _ACTIVATIONS.get(name.lower()) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(f"unknown activation {name!r}; known: {', '.join(sorted(_ACTIVATIONS))}")
    return cls()


class Flatten(Cell):
    """Dims ``start_dim`` .. ``end_dim`` merged into one (by default all but the batch dim)."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def construct(self, x: Tensor) -> Tensor:
        nd = x.ndim
        inside = nd and all(-nd <= d < nd for d in (self.start_dim, self.end_dim))  # not wrapped around
        s = self.start_dim % nd if inside else 0
        e = self.end_dim % nd if inside else 0
        if not inside or s > e:
            raise ValueError(f"Flatten: start_dim {self.start_dim} and end_dim {self.end_dim} do not select "
                             f"dims of a tensor of shape {list(x.shape)}")
        return _m.reshape(x, x.shape[:s] + (-1,) + x.shape[e + 1:])


def _check_dim(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"Dense: {what} must be a positive int, got {value!r}")
    return int(value)


class Dense(Cell):
    """y = activation(x @ weight.T + bias); weight (out_channels, in_channels).

    Defaults as MindSpore's: weight HeUniform(sqrt(5)), bias U(-1/sqrt(in), 1/sqrt(in)).
    """

    def __init__(self, in_channels: int, out_channels: int, weight_init: Any = None, bias_init: Any = None,
                 has_bias: bool = True, activation: Optional[Union[str, Cell]] = None,
                 dtype: Any = _dt.float32) -> None:
        super().__init__()
        self.in_channels = _check_dim(in_channels, "in_channels")
        self.out_channels = _check_dim(out_channels, "out_channels")
        self.has_bias = bool(has_bias)
        w_init = HeUniform(negative_slope=math.sqrt(5)) if weight_init is None else weight_init
        self.weight = Parameter(initializer(w_init, (self.out_channels, self.in_channels), dtype), name="weight")
        if self.has_bias:
            b_init = Uniform(1 / math.sqrt(self.in_channels)) if bias_init is None else bias_init
            self.bias = Parameter(initializer(b_init, (self.out_channels,), dtype), name="bias")
        else:
            self.bias = None
        if activation is None or isinstance(activation, Cell):
            self.activation = activation
        else:
            self.activation = get_activation(activation)

    def construct(self, x: Tensor) -> Tensor:
        out = dense(x, self.weight, self.bias)
        return out if self.activation is None else self.activation(out)

    def __repr__(self) -> str:
        return (f"Dense(input_channels={self.in_channels}, output_channels={self.out_channels}, "
                f"has_bias={self.has_bias}, activation={type(self.activation).__name__ if self.activation else None})")


class Dropout(Cell):
    """In training (``set_train()``), zero each element with probability ``p`` and scale the rest by
    1/(1-p); in evaluation, the identity. ``keep_prob`` is MindSpore's older spelling (1 - p)."""

    def __init__(self, keep_prob: Optional[float] = None, p: Optional[float] = None, dtype: Any = None) -> None:
        super().__init__()
        if keep_prob is not None and p is not None:
            raise ValueError("Dropout: give p or keep_prob, not both")
        if p is None:
            p = 0.5 if keep_prob is None else 1.0 - keep_prob
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
            raise ValueError(f"Dropout: p must be a number in [0, 1), got {p!r}")
        self.p = float(p)

    def construct(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        return self._drop(x)

    @breaks_trace("Dropout in training draws a new random mask on every call, which a graph would keep as traced")
    def _drop(self, x: Tensor) -> Tensor:
        """``x`` with a new random mask applied."""
        keep = _seed.generator().random(x.shape) >= self.p
        scale = (keep / (1.0 - self.p)).astype(x._data.dtype)
        return _m.mul(x, Tensor._from_array(_device.like(scale, x._data, "Dropout's mask")))  # drawn on the host
