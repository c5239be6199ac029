"""``gradcheck``: analytic gradients against central differences in float64.

For random weights ``v`` on the outputs, the backward pass gives
``d<v, f(x)>/dx`` for every input element at once; central differences of
``<v, f(x)>`` (each input element moved by ±eps, arithmetic in float64) give
the same numbers numerically. Any element off by more than
``atol + rtol * |numeric|`` fails, and the report names the worst one.
"""
from __future__ import annotations

from typing import Any, Callable, List, Sequence

import numpy as np

from .. import device as _device
from . import engine
from .grad_mode import enable_grad, no_grad
from ..tensor import Tensor

__all__ = ["gradcheck", "GradcheckError"]


class GradcheckError(AssertionError):
    """Analytic and numerical gradients disagree (the message names the worst element)."""


def _outputs(out: Any) -> List[Any]:
    items = list(out) if isinstance(out, (tuple, list)) else [out]
    return [o for o in items if isinstance(o, Tensor) and o._data.dtype.kind == "f"]


def _weighted_sum(outs: Sequence[Any], weights: Sequence[np.ndarray]) -> float:
    return float(sum(np.sum(o._data.astype(np.float64) * w) for o, w in zip(outs, weights)))


def gradcheck(fn: Callable[..., Any], inputs: Sequence[Any], eps: float = 1e-6, atol: float = 1e-5,
              rtol: float = 1e-3, seed: int = 0, raise_exception: bool = True) -> bool:
    """Check ``fn``'s gradients w.r.t. every floating Tensor in ``inputs``.

    Pass float64 inputs for meaningful numbers (float32 differences are noisy).
    Returns True, or raises GradcheckError (False with raise_exception=False).
    """
    inputs = list(inputs)
    checked = [i for i, x in enumerate(inputs) if isinstance(x, Tensor) and x._data.dtype.kind == "f"]
    if not checked:
        raise ValueError("gradcheck needs at least one floating-point Tensor among the inputs")
    rng = np.random.default_rng(seed)

    leaves = list(inputs)
    for i in checked:
        leaves[i] = Tensor._from_array(inputs[i]._data.copy()).requires_grad_(True)
    with enable_grad():
        outs = _outputs(fn(*leaves))
    if not outs:
        raise ValueError("gradcheck: the function returned no floating-point Tensor")
    # the weights are drawn on the host and live on their output's device (GPU outputs too)
    weights = [_device.to_device(rng.standard_normal(o._data.shape), _device.device_of(o._data)) for o in outs]
    diff_outs = [(o, w) for o, w in zip(outs, weights) if o.requires_grad]
    if diff_outs:
        sens = [Tensor._from_array(w.astype(o._data.dtype)) for o, w in diff_outs]
        analytic = engine.grad([o for o, _ in diff_outs], [leaves[i] for i in checked], sens,
                               allow_unused=True)
    else:
        analytic = [None] * len(checked)

    worst = None
    for k, i in enumerate(checked):
        base = inputs[i]._data
        device = _device.device_of(base)
        host = _device.to_device(base, _device.CPU)  # differences are taken on the host, evaluated on the device
        a = np.zeros(base.shape) if analytic[k] is None else \
            _device.to_device(analytic[k]._data, _device.CPU).astype(np.float64)
        num = np.zeros(base.shape)
        for idx in np.ndindex(base.shape):
            vals = []
            for step in (eps, -eps):
                x = host.astype(np.float64)  # (a copy)
                x[idx] += step
                args = list(inputs)
                args[i] = Tensor._from_array(_device.to_device(x.astype(base.dtype), device))
                with no_grad():
                    vals.append(_weighted_sum(_outputs(fn(*args)), weights))
            num[idx] = (vals[0] - vals[1]) / (2 * eps)
        err = np.abs(a - num) - (atol + rtol * np.abs(num))
        if err.size and (worst is None or err.max() > worst[0]):
            j = np.unravel_index(int(np.argmax(err)), err.shape)
            worst = (float(err.max()), i, tuple(int(t) for t in j), float(a[j]), float(num[j]))
    if worst is not None and worst[0] > 0:
        _, i, j, a_v, n_v = worst
        msg = (f"gradcheck failed: input {i}, element {list(j)}: analytic {a_v:.8g} vs numerical {n_v:.8g} "
               f"(|diff| {abs(a_v - n_v):.3g} > atol {atol:g} + rtol {rtol:g} * |numerical|)")
        low = sorted({str(inputs[c]._data.dtype) for c in checked} - {"float64"})
        if low:  # the usual cause of a failure that is not a wrong gradient
            msg += (f"; the inputs include {', '.join(low)}: differences at that precision are inaccurate "
                    f"at eps={eps:g}; check with float64 inputs, or a larger eps and tolerances")
        if raise_exception:
            raise GradcheckError(msg)
        return False
    return True
