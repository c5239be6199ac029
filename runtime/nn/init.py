"""Initializers (MindSpore's ``mindspore.common.initializer``): ``initializer(init, shape, dtype)``.

``init`` is an ``Initializer`` (``Zero``, ``One``, ``Constant``, ``Normal``,
``Uniform``, ``HeUniform``, ``HeNormal``, ``XavierUniform``, ``XavierNormal``,
``TruncatedNormal``), one of their names as a string (``"zeros"``,
``"he_uniform"`` ...), a number, or an array/Tensor of the right shape.
Random ones draw from ``runtime.seed`` so ``set_seed`` makes them repeatable.
"""
from __future__ import annotations

import math
from typing import Any, Sequence, Tuple

import numpy as np

from .. import device as _device
from .. import dtypes as _dt
from .. import seed as _seed
from ..tensor import Tensor

__all__ = ["Initializer", "Zero", "One", "Constant", "Normal", "Uniform", "HeUniform", "HeNormal",
           "XavierUniform", "XavierNormal", "TruncatedNormal", "initializer"]


def _fans(shape: Tuple[int, ...]) -> Tuple[int, int]:
    """(fan_in, fan_out) of a weight laid out (out, in, *kernel)."""
    if len(shape) < 2:
        raise ValueError(f"fan_in/fan_out need a shape of at least 2 dimensions, got {list(shape)}")
    receptive = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    return shape[1] * receptive, shape[0] * receptive


def _gain(nonlinearity: str, negative_slope: float) -> float:
    if nonlinearity in ("linear", "sigmoid", "conv1d", "conv2d", "conv3d"):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        return math.sqrt(2.0 / (1 + negative_slope ** 2))
    raise ValueError(f"unknown nonlinearity {nonlinearity!r}; use 'linear', 'sigmoid', 'tanh', 'relu' "
                     f"or 'leaky_relu'")


class Initializer:
    """Fills an array of a given shape; subclasses define ``_fill(shape) -> float64 array``."""

    def _fill(self, shape: Tuple[int, ...]) -> np.ndarray:
        raise NotImplementedError

    def __call__(self, shape: Tuple[int, ...]) -> np.ndarray:
        return self._fill(tuple(shape))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"


class Zero(Initializer):
    def _fill(self, shape):
        return np.zeros(shape)


class One(Initializer):
    def _fill(self, shape):
        return np.ones(shape)


class Constant(Initializer):
    def __init__(self, value: float) -> None:
        self.value = value

    def _fill(self, shape):
        return np.full(shape, self.value, dtype=np.float64)


class Normal(Initializer):
    def __init__(self, sigma: float = 0.01, mean: float = 0.0) -> None:
        self.sigma, self.mean = sigma, mean

    def _fill(self, shape):
        return _seed.generator().normal(self.mean, self.sigma, shape)


class Uniform(Initializer):
    """U(-scale, scale)."""

    def __init__(self, scale: float = 0.07) -> None:
        self.scale = scale

    def _fill(self, shape):
        return _seed.generator().uniform(-self.scale, self.scale, shape)


class TruncatedNormal(Initializer):
    """N(mean, sigma) redrawn outside [a, b] (two sigmas by default)."""

    def __init__(self, sigma: float = 0.01, mean: float = 0.0, a: float = -2.0, b: float = 2.0) -> None:
        self.sigma, self.mean, self.a, self.b = sigma, mean, a, b

    def _fill(self, shape):
        rng = _seed.generator()
        out = rng.normal(self.mean, self.sigma, shape)
        lo, hi = self.mean + self.a * self.sigma, self.mean + self.b * self.sigma
        bad = (out < lo) | (out > hi)
        while bad.any():
            out[bad] = rng.normal(self.mean, self.sigma, int(bad.sum()))
            bad = (out < lo) | (out > hi)
        return out


class HeUniform(Initializer):
    """Kaiming uniform: U(-b, b), b = gain * sqrt(3 / fan)."""

    def __init__(self, negative_slope: float = 0, mode: str = "fan_in", nonlinearity: str = "leaky_relu") -> None:
        if mode not in ("fan_in", "fan_out"):
            raise ValueError(f"mode must be 'fan_in' or 'fan_out', got {mode!r}")
        self.negative_slope, self.mode, self.nonlinearity = negative_slope, mode, nonlinearity

    def _bound(self, shape) -> float:
        fan_in, fan_out = _fans(shape)
        fan = fan_in if self.mode == "fan_in" else fan_out
        return _gain(self.nonlinearity, self.negative_slope) / math.sqrt(fan) if fan else 0.0

    def _fill(self, shape):
        b = self._bound(shape) * math.sqrt(3.0)
        return _seed.generator().uniform(-b, b, shape)


class HeNormal(HeUniform):
    """Kaiming normal: N(0, gain / sqrt(fan))."""

    def _fill(self, shape):
        return _seed.generator().normal(0.0, self._bound(shape), shape)


class XavierUniform(Initializer):
    """Glorot uniform: U(-b, b), b = gain * sqrt(6 / (fan_in + fan_out))."""

    def __init__(self, gain: float = 1) -> None:
        self.gain = gain

    def _fill(self, shape):
        fan_in, fan_out = _fans(shape)
        b = self.gain * math.sqrt(6.0 / max(fan_in + fan_out, 1))
        return _seed.generator().uniform(-b, b, shape)


class XavierNormal(XavierUniform):
    """Glorot normal: N(0, gain * sqrt(2 / (fan_in + fan_out)))."""

    def _fill(self, shape):
        fan_in, fan_out = _fans(shape)
        return _seed.generator().normal(0.0, self.gain * math.sqrt(2.0 / max(fan_in + fan_out, 1)), shape)


_NAMES = {"zeros": Zero, "zero": Zero, "ones": One, "one": One, "normal": Normal, "uniform": Uniform,
          "truncatednormal": TruncatedNormal, "heuniform": HeUniform, "henormal": HeNormal,
          "xavieruniform": XavierUniform, "xaviernormal": XavierNormal}


def _shape(shape: Any) -> Tuple[int, ...]:
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        return (int(shape),)
    if isinstance(shape, (tuple, list)) and all(isinstance(s, (int, np.integer)) and not isinstance(s, bool)
                                                and s >= 0 for s in shape):
        return tuple(int(s) for s in shape)
    raise TypeError(f"initializer: shape must be an int or a tuple of non-negative ints, got {shape!r}")


def initializer(init: Any, shape: Sequence[int] = None, dtype: Any = _dt.float32) -> Tensor:
    """A Tensor of ``shape`` and ``dtype`` filled by ``init`` (see the module docstring)."""
    dt = _dt.to_dtype(dtype).np
    if isinstance(init, (Tensor, np.ndarray)):
        arr = init._data if isinstance(init, Tensor) else np.asarray(init)  # a GPU tensor's stays there
        if shape is not None and arr.shape != _shape(shape):
            raise ValueError(f"initializer: the given array has shape {list(arr.shape)}, expected "
                             f"{list(_shape(shape))}")
        arr = arr.astype(dt)
        return Tensor._from_array(arr if _device.is_device_array(arr) else _device.on_default_device(arr))
    if shape is None:
        raise TypeError("initializer: shape is needed unless init is an array")
    sh = _shape(shape)
    if isinstance(init, str):
        cls = _NAMES.get(init.lower().replace("_", ""))
        if cls is None:
            raise ValueError(f"initializer: unknown name {init!r}; known: {', '.join(sorted(set(_NAMES)))}")
        init = cls()
    elif isinstance(init, (int, float)) and not isinstance(init, bool):
        init = Constant(init)
    if not isinstance(init, Initializer):
        raise TypeError(f"initializer: init must be an Initializer, a name, a number or an array, "
                        f"got {type(init).__name__}")
    # drawn on the host (set_seed repeats it on any device), then put on the context's device;
    # (ascontiguousarray would make 0-d 1-d)
    return Tensor._from_array(_device.on_default_device(np.array(init(sh), dtype=dt, order="C")))
