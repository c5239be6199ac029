"""Optimizers (MindSpore's ``nn`` names): ``SGD``, ``Momentum``, ``Adam``, ``AdamWeightDecay``.

``optimizer(grads)`` updates ``optimizer.parameters`` in place (same
Parameter objects, version bumped), one gradient per parameter in that
order, as ``value_and_grad(fn, None, optimizer.parameters)`` returns them.
The learning rate is a number, a list (one per step; the last one holds
after the end) or a callable ``step -> lr``. The arithmetic is numpy's,
in place, outside any graph.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from .. import device as _device
from ..tensor import Parameter, Tensor
from ..versions import rebind

__all__ = ["Optimizer", "SGD", "Momentum", "Adam", "AdamWeightDecay"]

LearningRate = Union[float, Sequence[float], Callable[[int], float]]


def _nonneg(value: Any, what: str, cls: str, upper: float = math.inf, open_upper: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"{cls}: {what} must be a number, got {type(value).__name__}")
    v = float(value)
    if v < 0 or v > upper or (open_upper and v == upper):
        bound = f"in [0, {upper})" if open_upper else (f"in [0, {upper}]" if upper != math.inf else ">= 0")
        raise ValueError(f"{cls}: {what} must be {bound}, got {value}")
    return v


class Optimizer:
    """Base: keeps the parameters, the learning-rate schedule and the step count."""

    def __init__(self, learning_rate: LearningRate, parameters: Any, weight_decay: float = 0.0,
                 loss_scale: float = 1.0) -> None:
        name = type(self).__name__
        if isinstance(parameters, Tensor) or parameters is None:
            raise TypeError(f"{name}: parameters must be a list of Parameters (e.g. net.trainable_params())")
        params = list(parameters)
        if not params:
            raise ValueError(f"{name}: the parameter list is empty (did the network register any Parameter?)")
        for p in params:
            if not isinstance(p, Parameter):
                raise TypeError(f"{name}: parameters must be Parameters, got {type(p).__name__}")
            if p._data.dtype.kind not in "fV":  # real floats and bfloat16
                raise TypeError(f"{name}: parameter {p.name!r} is {p.dtype}; only floating parameters train")
        if len({id(p) for p in params}) != len(params):
            raise ValueError(f"{name}: a parameter is listed twice")
        self._params: Tuple[Parameter, ...] = tuple(params)
        # the names its state is saved under: the parameters' names when the optimizer was made, so that a
        # network later put in other containers (which names its Parameters anew) still saves and resumes
        # its state under the names a freshly built network and optimizer have
        self._names: Tuple[Optional[str], ...] = tuple(p.name for p in params)
        self._lr = self._schedule(learning_rate)
        self.weight_decay = _nonneg(weight_decay, "weight_decay", name)
        if isinstance(loss_scale, bool) or not isinstance(loss_scale, (int, float, np.floating, np.integer)) \
                or not float(loss_scale) > 0:
            raise ValueError(f"{name}: loss_scale must be a positive number, got {loss_scale!r}")
        self.loss_scale = float(loss_scale)
        # MindSpore decays only the parameters without 'beta' or 'gamma' in their names (norm layers' shift
        # and scale), when the parameters are not grouped
        self.decay_flags: Tuple[bool, ...] = tuple(not p.name or ("beta" not in p.name and "gamma" not in p.name)
                                                   for p in params)
        self.global_step = 0

    def _schedule(self, lr: LearningRate) -> Callable[[int], float]:
        name = type(self).__name__
        if callable(lr):
            return lr
        if isinstance(lr, Tensor):
            lr = lr._data.tolist()
        if isinstance(lr, (list, tuple)):
            if not lr:
                raise ValueError(f"{name}: a learning-rate list must not be empty")
            steps = [_nonneg(v, "every learning rate", name) for v in lr]
            return lambda step: steps[min(step, len(steps) - 1)]
        value = _nonneg(lr, "learning_rate", name)
        return lambda step: value

    @property
    def parameters(self) -> Tuple[Parameter, ...]:
        return self._params

    def get_lr(self) -> float:
        """The learning rate the next step uses."""
        return float(self._lr(self.global_step))

    def _arrays(self, grads: Sequence[Any]) -> List[np.ndarray]:
        name = type(self).__name__
        if isinstance(grads, Tensor):
            grads = (grads,)
        grads = list(grads)
        if len(grads) != len(self._params):
            raise ValueError(f"{name}: got {len(grads)} gradients for {len(self._params)} parameters; pass one "
                             f"per parameter, in optimizer.parameters order")
        out = []
        for p, g in zip(self._params, grads):
            if g is None:  # (torch's optimizers skip such a parameter; MindSpore's gradients are never None)
                raise TypeError(f"{name}: the gradient for parameter {p.name!r} is None; pass a gradient for every "
                                f"parameter (value_and_grad gives zeros for one the loss does not use)")
            if isinstance(g, Tensor):
                a = g._data
                if (type(a) is not np.ndarray or type(p._data) is not np.ndarray) and \
                        _device.device_of(a) != _device.device_of(p._data):
                    raise _device.DeviceMismatchError(
                        f"{name}: the gradient for parameter {p.name!r} is on {_device.device_of(a)}, the parameter "
                        f"on {_device.device_of(p._data)}; compute the gradients where the parameters are")
            else:  # an array or list: host data goes to the parameter's device
                a = _device.like(g, p._data, f"{name}: the gradient for parameter {p.name!r}")
            if a.shape != p._data.shape:
                raise ValueError(f"{name}: the gradient for parameter {p.name!r} has shape {list(a.shape)}, the "
                                 f"parameter {list(p._data.shape)}")
            out.append(a)
        return out

    def __call__(self, grads: Sequence[Any]) -> bool:
        """One update of every parameter from ``grads``; returns True (as MindSpore's optimizers do)."""
        arrays = self._arrays(grads)
        lr = self.get_lr()
        for i, (p, g) in enumerate(zip(self._params, arrays)):
            w = p._data
            if not _device.writeable(w):
                w = w.copy()
                rebind(p, w)  # memory of its own now: its old views keep their counter
            self._update(i, w, g.astype(w.dtype, copy=False), lr)
            p._version += 1
        self.global_step += 1
        return True

    def _update(self, i: int, w: np.ndarray, g: np.ndarray, lr: float) -> None:
        raise NotImplementedError

    def _decayed(self, i: int, w: np.ndarray, g: np.ndarray) -> np.ndarray:
        """MindSpore's order: (g + weight_decay * loss_scale * w) / loss_scale, i.e. g / loss_scale +
        weight_decay * w (its Optimizer keeps weight_decay * loss_scale), the decay only where
        ``decay_flags[i]``."""
        if self.weight_decay and self.decay_flags[i]:
            g = g + (self.weight_decay * self.loss_scale) * w
        return g / self.loss_scale if self.loss_scale != 1.0 else g

    # ---- state, for checkpoints -----------------------------------------------------------
    def _param_names(self) -> List[str]:
        name = type(self).__name__
        names = []
        made = self._names  # as they were when it was made; or as they are now, if those did not name each one
        use_made = all(made) and len(set(made)) == len(made)
        for k, p in enumerate(self._params):
            n = made[k] if use_made else p.name
            if not n:
                raise ValueError(f"{name}: parameter {k} has no name, so its state cannot be saved by name; "
                                 f"give it one (Parameter(..., name=...)) or register it in a Cell")
            names.append(n)
        return names

    def _state(self, names: Optional[List[str]] = None) -> Dict[str, np.ndarray]:
        """Name -> array of what the next updates depend on, besides the parameters: ``global_step``
        (int32, shape [1], as MindSpore's) and the per-parameter buffers under MindSpore's prefixes,
        each named after its parameter: ``names`` (a cell's checkpoint gives its own), else
        ``_param_names()``."""
        step = np.array([self.global_step], np.int32)
        out = {"global_step": _device.to_device(step, _device.device_of(self._params[0]._data))}  # the params
        for prefix, arrays in self._buffers():
            for n, a in zip(names or self._param_names(), arrays):
                out[f"{prefix}.{n}"] = a
        return out

    def _buffers(self) -> List[Tuple[str, List[np.ndarray]]]:
        """(MindSpore's prefix, one array per parameter, true values) for each state buffer."""
        return []

    def _set_buffers(self, values: Dict[str, List[np.ndarray]], step: int) -> None:
        """Take the buffers (by prefix, one array per parameter) and the step count."""
        self.global_step = step

    def parameters_and_names(self) -> Iterator[Tuple[str, Tensor]]:
        """(name, tensor) of the parameters, then of the optimizer's state (copies), as MindSpore's
        optimizer Cell lists them: ``save_checkpoint(optimizer, path)`` writes both, and
        ``load_param_into_net(optimizer, load_checkpoint(path))`` resumes training where it stopped."""
        for n, p in zip(self._param_names(), self._params):
            yield n, p
        for n, a in self._state().items():
            yield n, Tensor._from_array(_device.array_module(a).array(a))  # a copy, on the parameters' device

    def _load_state(self, entries: Dict[str, np.ndarray], names: Optional[List[str]] = None) -> None:
        """Replace the state from ``entries`` (every name of ``_state(names)``, checked by the caller)."""
        step = int(entries["global_step"].reshape(-1)[0])  # an array (checked by the caller), maybe a GPU one
        names = names or self._param_names()
        self._set_buffers({prefix: [entries[f"{prefix}.{n}"] for n in names] for prefix, _ in self._buffers()},
                          step)


def _restored(a: Any, like: Any, dtype: Any) -> Any:
    """A checkpoint's array ``a`` as a new array in ``dtype`` on the device of ``like`` (the parameter's
    or its buffer's): state saved from a GPU run resumes on the CPU and the other way round."""
    src = a if _device.is_device_array(a) else np.asarray(a)
    return _device.to_device(src, _device.device_of(like)).astype(dtype)


class SGD(Optimizer):
    """v = momentum * v + (1 - dampening) * g (v = g on the first step); w -= lr * (g + momentum * v if
    nesterov else v). g is gradient / loss_scale + weight_decay * w (MindSpore's SGD kernel decays every
    parameter, after the loss scale is taken out)."""

    def __init__(self, params: Any, learning_rate: LearningRate = 0.1, momentum: float = 0.0,
                 dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False,
                 loss_scale: float = 1.0) -> None:
        super().__init__(learning_rate, params, weight_decay, loss_scale)
        self.momentum = _nonneg(momentum, "momentum", "SGD")
        self.dampening = _nonneg(dampening, "dampening", "SGD")
        if nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ValueError("SGD: nesterov needs momentum > 0 and dampening 0")
        self.nesterov = bool(nesterov)
        self.accum: List[Any] = [None] * len(self._params)

    def _update(self, i, w, g, lr):
        if self.loss_scale != 1.0:
            g = g / self.loss_scale
        if self.weight_decay:
            g = g + self.weight_decay * w
        if self.momentum:
            v = self.accum[i]
            if v is None:  # in the parameter's dtype (bfloat16 arithmetic gives float32): as saved and restored
                v = self.accum[i] = g.astype(w.dtype)
            else:
                v *= self.momentum
                v += (1 - self.dampening) * g
            g = g + self.momentum * v if self.nesterov else v
        w -= lr * g

    def _buffers(self):
        if not self.momentum:
            return []
        return [("accum", [np.zeros_like(p._data) if a is None else a.copy()
                           for a, p in zip(self.accum, self._params)])]

    def _set_buffers(self, values, step):
        super()._set_buffers(values, step)
        if self.momentum:  # no step taken yet: the first one starts the buffer from its gradient
            self.accum = [_restored(a, p._data, p._data.dtype) if step else None
                          for a, p in zip(values["accum"], self._params)]


class Momentum(Optimizer):
    """v = momentum * v + g; w -= lr * v (lr * (g + momentum * v) with use_nesterov); g is
    (gradient + weight_decay * loss_scale * w) / loss_scale, as in MindSpore (whose optimizers keep
    weight_decay * loss_scale), the decay only on parameters without 'beta' or 'gamma' in their names."""

    def __init__(self, params: Any, learning_rate: LearningRate, momentum: float, weight_decay: float = 0.0,
                 loss_scale: float = 1.0, use_nesterov: bool = False) -> None:
        super().__init__(learning_rate, params, weight_decay, loss_scale)
        self.momentum = _nonneg(momentum, "momentum", "Momentum")
        self.use_nesterov = bool(use_nesterov)
        self.moments = [np.zeros_like(p._data) for p in self._params]

    def _update(self, i, w, g, lr):
        g = self._decayed(i, w, g)
        v = self.moments[i]
        v *= self.momentum
        v += g
        w -= lr * (g + self.momentum * v) if self.use_nesterov else lr * v

    def _buffers(self):
        return [("moments", [v.copy() for v in self.moments])]

    def _set_buffers(self, values, step):
        super()._set_buffers(values, step)
        self.moments = [_restored(a, p._data, p._data.dtype) for a, p in zip(values["moments"], self._params)]


def _state_dtype(p: Parameter) -> Any:
    """Adam's moments of a float16 parameter are kept in float32: its second moment, kept scaled by
    1/(1-beta2), would overflow float16 (g = 10 with beta2 = 0.999 already does), and a small g^2 would
    underflow to 0 and blow the step up."""
    return np.float32 if p._data.dtype == np.float16 else p._data.dtype


class Adam(Optimizer):
    """m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; w -= lr * sqrt(1-b2^t)/(1-b1^t) * m / (sqrt(v) + eps).
    g is (gradient + weight_decay * loss_scale * w) / loss_scale, as in MindSpore, the decay only on
    parameters without 'beta' or 'gamma' in their names.

    ``moment1``/``moment2`` give copies of m and v (float32 for float16 parameters, whose moments are
    kept in float32).
    """

    def __init__(self, params: Any, learning_rate: LearningRate = 1e-3, beta1: float = 0.9, beta2: float = 0.999,
                 eps: float = 1e-8, use_locking: bool = False, use_nesterov: bool = False, weight_decay: float = 0.0,
                 loss_scale: float = 1.0, use_amsgrad: bool = False) -> None:
        super().__init__(learning_rate, params, weight_decay, loss_scale)
        self.beta1 = _nonneg(beta1, "beta1", "Adam", 1.0, open_upper=True)
        self.beta2 = _nonneg(beta2, "beta2", "Adam", 1.0, open_upper=True)
        self.eps = _nonneg(eps, "eps", "Adam")
        if self.eps == 0:
            raise ValueError("Adam: eps must be positive")
        if use_amsgrad:
            raise NotImplementedError("Adam: use_amsgrad is not supported")
        self.use_nesterov = bool(use_nesterov)
        self._m = [np.zeros_like(p._data, dtype=_state_dtype(p)) for p in self._params]
        self._v = [np.zeros_like(p._data, dtype=_state_dtype(p)) for p in self._params]
        self._scratch = [np.empty_like(p._data, dtype=_state_dtype(p)) for p in self._params]

    @property
    def moment1(self) -> List[np.ndarray]:
        return [m.copy() for m in self._m]

    @property
    def moment2(self) -> List[np.ndarray]:
        return [v.copy() for v in self._v]

    def _update(self, i, w, g, lr):
        m, v, s = self._m[i], self._v[i], self._scratch[i]
        g = self._decayed(i, w, g.astype(m.dtype, copy=False))
        b1, b2, t = self.beta1, self.beta2, self.global_step + 1
        # twelve passes over memory, each in place (no temporaries), on m and v themselves: a checkpoint
        # holds them as they are, so a resumed run is the very same run (kept scaled by 1/(1-b), they were
        # not: the division back on load rounds)
        m *= b1
        np.multiply(g, 1 - b1, out=s)
        m += s
        v *= b2
        np.multiply(g, g, out=s)
        s *= 1 - b2
        v += s
        scale = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        num = m * b1 + (1 - b1) * g if self.use_nesterov else m
        np.sqrt(v, out=s)
        s += self.eps
        np.divide(num, s, out=s)
        s *= scale
        w -= s

    def _buffers(self):
        return [("moment1", self.moment1), ("moment2", self.moment2)]

    def _set_buffers(self, values, step):
        super()._set_buffers(values, step)
        self._m = [_restored(a, m, m.dtype) for a, m in zip(values["moment1"], self._m)]
        self._v = [_restored(a, v, v.dtype) for a, v in zip(values["moment2"], self._v)]


class AdamWeightDecay(Optimizer):
    """m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; u = m / (sqrt(v) + eps) + weight_decay * w; w -= lr * u
    (no bias correction, as MindSpore's; the decay only on parameters without 'beta' or 'gamma' in
    their names). A float16 parameter's moments are float32 (as Adam's)."""

    def __init__(self, params: Any, learning_rate: LearningRate = 1e-3, beta1: float = 0.9, beta2: float = 0.999,
                 eps: float = 1e-6, weight_decay: float = 0.0) -> None:
        super().__init__(learning_rate, params, weight_decay)
        self.beta1 = _nonneg(beta1, "beta1", "AdamWeightDecay", 1.0, open_upper=True)
        self.beta2 = _nonneg(beta2, "beta2", "AdamWeightDecay", 1.0, open_upper=True)
        self.eps = _nonneg(eps, "eps", "AdamWeightDecay")
        if self.eps == 0:
            raise ValueError("AdamWeightDecay: eps must be positive")
        # float32 for a float16 parameter, as Adam's (_state_dtype): g * g overflows float16 from |g| = 256,
        # and an inf second moment stops that element for good (m / inf is 0, b2 * inf stays inf)
        self.moments1 = [np.zeros_like(p._data, dtype=_state_dtype(p)) for p in self._params]
        self.moments2 = [np.zeros_like(p._data, dtype=_state_dtype(p)) for p in self._params]

    def _update(self, i, w, g, lr):
        b1, b2 = self.beta1, self.beta2
        m, v = self.moments1[i], self.moments2[i]
        g = g.astype(m.dtype, copy=False)
        m *= b1
        m += (1 - b1) * g
        v *= b2
        v += (1 - b2) * (g * g)
        u = m / (np.sqrt(v) + self.eps)
        if self.weight_decay and self.decay_flags[i]:
            u += self.weight_decay * w
        w -= (lr * u).astype(w.dtype, copy=False)

    def _buffers(self):
        return [("adam_m", [m.copy() for m in self.moments1]), ("adam_v", [v.copy() for v in self.moments2])]

    def _set_buffers(self, values, step):
        super()._set_buffers(values, step)
        self.moments1 = [_restored(a, p._data, _state_dtype(p)) for a, p in zip(values["adam_m"], self._params)]
        self.moments2 = [_restored(a, p._data, _state_dtype(p)) for a, p in zip(values["adam_v"], self._params)]
