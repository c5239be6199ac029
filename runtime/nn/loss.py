"""Loss cells (MindSpore's ``nn`` names): ``MSELoss``, ``L1Loss``, ``CrossEntropyLoss``,
``SoftmaxCrossEntropyWithLogits``.

Cross-entropy works in log space (``log_softmax``), so large logits neither
overflow nor give NaN. Integer class labels take a fused primitive whose rule
is (softmax - one_hot) * weight: one node for the whole loss.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .. import device as _device
from ..ops import math as _m
from ..ops.primitive import Primitive, defvjp
from ..ops.softmax_ops import log_softmax
from ..tensor import Tensor
from .cell import Cell

__all__ = ["LossBase", "MSELoss", "L1Loss", "CrossEntropyLoss", "SoftmaxCrossEntropyWithLogits"]

_REDUCTIONS = ("mean", "sum", "none")


class LossBase(Cell):
    """A loss with ``reduction`` 'mean', 'sum' or 'none'."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        if reduction not in _REDUCTIONS:
            raise ValueError(f"{type(self).__name__}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
        self.reduction = reduction

    def get_loss(self, x: Tensor, weights: Any = 1.0) -> Tensor:
        if not (isinstance(weights, float) and weights == 1.0):
            x = _m.mul(x, weights)
        if self.reduction == "mean":
            return _m.mean(x)
        if self.reduction == "sum":
            return _m.sum(x)
        return x


def _same_shape(name: str, logits: Tensor, labels: Tensor) -> None:
    if logits.shape != labels.shape:
        raise ValueError(f"{name}: logits have shape {list(logits.shape)} but labels {list(labels.shape)}; "
                         f"they must match")


class MSELoss(LossBase):
    """(logits - labels)^2, reduced."""

    def construct(self, logits: Tensor, labels: Tensor) -> Tensor:
        logits, labels = _m._pair(logits, labels)
        _same_shape("MSELoss", logits, labels)
        d = _m.sub(logits, labels)
        return self.get_loss(_m.mul(d, d))


class L1Loss(LossBase):
    """|logits - labels|, reduced."""

    def construct(self, logits: Tensor, labels: Tensor) -> Tensor:
        logits, labels = _m._pair(logits, labels)
        _same_shape("L1Loss", logits, labels)
        return self.get_loss(_m.abs(_m.sub(logits, labels)))


# ---- cross-entropy with integer labels: one node ------------------------------------
def _nll_np(x: np.ndarray, labels: np.ndarray, weight: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Per-sample -weight[label] * log_softmax(x)[label]; 0 where ``valid`` is False. x is (N, C)."""
    shifted = x - np.max(x, axis=1, keepdims=True)
    lse = np.log(np.sum(np.exp(shifted), axis=1))
    safe = np.where(valid, labels, 0)
    picked = shifted[_device.array_module(x).arange(x.shape[0]), safe]
    return np.where(valid, (lse - picked) * weight[safe], 0).astype(x.dtype, copy=False)


def _nll_vjp(g: Tensor, ans: Tensor, x: Tensor, labels: np.ndarray, weight: np.ndarray,
             valid: np.ndarray) -> Tensor:
    n, c = x.shape
    xp = _device.array_module(x._data)
    safe = np.where(valid, labels, 0)
    hot = xp.zeros((n, c), x._data.dtype)
    hot[xp.arange(n), safe] = 1
    w = (np.where(valid, weight[safe], 0)).astype(x._data.dtype)[:, None]
    probs = _m.exp(log_softmax(x, 1))
    return _m.mul(_m.mul(_m.reshape(g, (n, 1)), Tensor._from_array(w)),
                  _m.sub(probs, Tensor._from_array(hot)))


_nll = Primitive("cross_entropy", _nll_np)
defvjp(_nll, _nll_vjp, reads_output=False, reads_inputs=(0,))


def _class_labels(name: str, logits: Tensor, labels: Tensor, ignore_index: Optional[int]):
    n, c = logits.shape
    lab = labels._data
    if lab.shape != (n,):
        raise ValueError(f"{name}: integer labels must have shape [{n}] for logits of shape [{n}, {c}], "
                         f"got {list(lab.shape)}")
    valid = _device.array_module(lab).ones(n, bool) if ignore_index is None else lab != ignore_index
    bad = valid & ((lab < 0) | (lab >= c))
    if bad.any():
        raise IndexError(f"{name}: label {int(lab[bad][0])} is out of range for {c} classes")
    return lab.astype(np.int64), valid


def _as_2d(name: str, logits: Tensor) -> Tensor:
    if logits._data.dtype.kind not in "fV":  # real floats and bfloat16
        raise TypeError(f"{name}: logits must be floating-point, got {logits.dtype}")
    if logits.ndim == 1:
        return _m.reshape(logits, (1, logits.shape[0]))
    if logits.ndim != 2:
        raise ValueError(f"{name}: logits must have shape [N, C] (or [C]), got {list(logits.shape)}")
    return logits


class CrossEntropyLoss(LossBase):
    """Cross-entropy of logits (N, C) against integer class labels (N,) or class probabilities (N, C).

    ``weight`` (C,) rescales each class; with integer labels 'mean' divides by the total weight of the
    labels counted; labels equal to ``ignore_index`` count for nothing; ``label_smoothing`` mixes the
    targets with the uniform distribution.
    """

    def __init__(self, weight: Any = None, ignore_index: int = -100, reduction: str = "mean",
                 label_smoothing: float = 0.0) -> None:
        super().__init__(reduction)
        self.weight = None if weight is None else \
            (weight.asnumpy() if isinstance(weight, Tensor) else np.asarray(weight))  # a GPU Tensor too
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"CrossEntropyLoss: label_smoothing must be in [0, 1], got {label_smoothing}")
        self.ignore_index = ignore_index
        self.label_smoothing = float(label_smoothing)

    def construct(self, logits: Tensor, labels: Tensor) -> Tensor:
        x = _as_2d("CrossEntropyLoss", logits)
        y = labels if isinstance(labels, Tensor) else Tensor(labels)
        c = x.shape[1]
        if self.weight is not None and self.weight.shape != (c,):
            raise ValueError(f"CrossEntropyLoss: weight must have shape [{c}], got {list(self.weight.shape)}")
        if y._data.dtype.kind in "iu":
            if logits.ndim == 1:
                y = _m.reshape(y, (1,))
            if self.label_smoothing:
                out = self._smoothed(x, y)
                return out if logits.ndim == 2 or self.reduction != "none" else _m.reshape(out, ())
            lab, valid = _class_labels("CrossEntropyLoss", x, y, self.ignore_index)
            w = self._class_weight(x, c)
            per = _nll(x, labels=lab, weight=w, valid=valid)
            if self.reduction == "mean":
                return _weighted_mean(per, float(np.sum(np.where(valid, w[np.where(valid, lab, 0)], 0))))
            if self.reduction == "sum":
                return _m.sum(per)
            return per if logits.ndim == 2 else _m.reshape(per, ())
        return self._soft(x, y, logits.ndim)

    def _class_weight(self, x: Tensor, c: int) -> Any:
        """The per-class weights as an array on x's device, in x's dtype (ones without ``weight``)."""
        xp = _device.array_module(x._data)
        return xp.ones(c, x._data.dtype) if self.weight is None else xp.asarray(self.weight).astype(x._data.dtype)

    def _targets_weight(self, x: Tensor) -> Optional[Tensor]:
        return None if self.weight is None else Tensor._from_array(self._class_weight(x, x.shape[1]))

    def _soft(self, x: Tensor, y: Tensor, ndim: int) -> Tensor:
        if y._data.dtype.kind not in "fV":
            raise TypeError(f"CrossEntropyLoss: labels must be integer classes or floating probabilities, "
                            f"got {y.dtype}")
        if ndim == 1:
            y = _m.reshape(y, (1,) + y.shape)
        if y.ndim == x.ndim - 1 and y.shape == x.shape[:1] + x.shape[2:]:  # class indices, given as floats
            raise TypeError(f"CrossEntropyLoss: labels of shape {list(y.shape)} are class indices, which must be "
                            f"integers, got {y.dtype}; cast them (labels.astype(runtime.int32)), or give "
                            f"probabilities of the logits' shape {list(x.shape)}")
        _same_shape("CrossEntropyLoss", x, y)
        c = x.shape[1]
        if self.label_smoothing:
            y = _m.add(_m.mul(y, 1.0 - self.label_smoothing), self.label_smoothing / c)
        terms = _m.mul(log_softmax(x, 1), y)
        w = self._targets_weight(x)
        if w is not None:
            terms = _m.mul(terms, w)
        per = _m.neg(_m.sum(terms, 1))
        if self.reduction == "mean":
            return _m.mean(per)
        if self.reduction == "sum":
            return _m.sum(per)
        return per if ndim == 2 else _m.reshape(per, ())

    def _smoothed(self, x: Tensor, y: Tensor) -> Tensor:
        lab, valid = _class_labels("CrossEntropyLoss", x, y, self.ignore_index)
        n, c = x.shape
        xp = _device.array_module(x._data)
        hot = xp.zeros((n, c), x._data.dtype)
        hot[xp.arange(n)[valid], lab[valid]] = 1
        logp = log_softmax(x, 1)
        smooth = Tensor._from_array((hot * (1 - self.label_smoothing) + self.label_smoothing / c) *
                                    valid[:, None].astype(x._data.dtype))
        w = self._targets_weight(x)
        terms = _m.mul(logp, smooth) if w is None else _m.mul(_m.mul(logp, smooth), w)
        per = _m.neg(_m.sum(terms, 1))
        if self.reduction == "mean":
            wl = xp.ones(c) if self.weight is None else xp.asarray(self.weight)
            return _weighted_mean(per, float(np.sum(wl[lab[valid]])))
        return _m.sum(per) if self.reduction == "sum" else per


def _weighted_mean(per: Tensor, total: float) -> Tensor:
    """sum(per) / total, the labels' total weight. With none counted (every label ignored, an empty batch)
    NaN, as torch's 0/0, while the gradient stays 0 (per is 0 there): the NaN is added, not divided by."""
    out = _m.div(_m.sum(per), max(total, 1e-38))
    return _m.add(out, float("nan")) if total == 0 else out


class SoftmaxCrossEntropyWithLogits(LossBase):
    """Cross-entropy of logits (N, C) against one-hot/probability labels (N, C), or class indices (N,)
    with ``sparse=True``. MindSpore's default reduction here is 'none' (one loss per sample)."""

    def __init__(self, sparse: bool = False, reduction: str = "none") -> None:
        super().__init__(reduction)
        self.sparse = bool(sparse)

    def construct(self, logits: Tensor, labels: Tensor) -> Tensor:
        x = _as_2d("SoftmaxCrossEntropyWithLogits", logits)
        y = labels if isinstance(labels, Tensor) else Tensor(labels)
        if self.sparse:
            if y._data.dtype.kind not in "iu":
                raise TypeError(f"SoftmaxCrossEntropyWithLogits(sparse=True): labels must be integer class "
                                f"indices, got {y.dtype}")
            lab, valid = _class_labels("SoftmaxCrossEntropyWithLogits", x, _m.reshape(y, (x.shape[0],)), None)
            per = _nll(x, labels=lab, weight=_device.array_module(x._data).ones(x.shape[1], x._data.dtype),
                       valid=valid)
        else:
            if y._data.dtype.kind not in "fV":
                raise TypeError(f"SoftmaxCrossEntropyWithLogits(sparse=False): labels must be floating one-hot "
                                f"or probabilities, got {y.dtype}; pass sparse=True for class indices")
            y = _m.reshape(y, x.shape) if y.shape != x.shape and y.size == x.size else y
            _same_shape("SoftmaxCrossEntropyWithLogits", x, y)
            per = _m.neg(_m.sum(_m.mul(log_softmax(x, 1), y), 1))
        return self.get_loss(per)
