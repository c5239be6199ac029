"""MindSpore's training wrappers: ``ParameterTuple``, ``WithLossCell``, ``TrainOneStepCell``.

``TrainOneStepCell(WithLossCell(net, loss_fn), optimizer)`` is MindSpore's usual training step: each
call computes the loss and the gradients of the optimizer's parameters (``value_and_grad``), applies
the optimizer, and returns the loss.
"""
from __future__ import annotations

from typing import Any, Iterable

from ..tensor import Parameter, Tensor
from .cell import Cell

__all__ = ["ParameterTuple", "WithLossCell", "TrainOneStepCell"]


class ParameterTuple(tuple):
    """A tuple of Parameters (``ParameterTuple(net.trainable_params())``): the weights ``grad`` and
    ``GradOperation(get_by_list=True)`` take."""

    def __new__(cls, params: Iterable[Any]) -> "ParameterTuple":
        items = tuple(params)
        for p in items:
            if not isinstance(p, Parameter):
                raise TypeError(f"ParameterTuple holds Parameters, got {type(p).__name__}")
        names = [p.name for p in items if p.name]
        if len({id(p) for p in items}) != len(items) or len(set(names)) != len(names):
            raise ValueError("ParameterTuple: a parameter, or a parameter's name, is listed twice (names must be "
                             "unique, as MindSpore's)")
        return super().__new__(cls, items)


class WithLossCell(Cell):
    """``loss_fn(backbone(data), label)``: a network and its loss as one cell."""

    def __init__(self, backbone: Cell, loss_fn: Any) -> None:
        super().__init__(auto_prefix=False)  # the backbone's parameters keep their names
        if not callable(backbone) or not callable(loss_fn):
            raise TypeError("WithLossCell(backbone, loss_fn): both must be callable (a Cell, a loss)")
        self._backbone = backbone
        self._loss_fn = loss_fn

    @property
    def backbone_network(self) -> Cell:
        return self._backbone

    def construct(self, data: Tensor, label: Tensor) -> Tensor:
        return self._loss_fn(self._backbone(data), label)


class TrainOneStepCell(Cell):
    """One training step per call: the loss of ``network(*inputs)``, its gradients with respect to the
    optimizer's parameters (times ``sens``), the optimizer applied; returns the loss."""

    def __init__(self, network: Cell, optimizer: Any, sens: float = 1.0) -> None:
        super().__init__(auto_prefix=False)
        params = getattr(optimizer, "parameters", None)
        if params is None or not callable(optimizer):
            raise TypeError(f"TrainOneStepCell(network, optimizer): optimizer must be an nn.Optimizer, got "
                            f"{type(optimizer).__name__}")
        if isinstance(sens, bool) or not isinstance(sens, (int, float)):
            raise TypeError(f"TrainOneStepCell: sens must be a number, got {type(sens).__name__}")
        self.network = network
        self.optimizer = optimizer
        self.weights = ParameterTuple(params)
        self.sens = float(sens)

    def construct(self, *inputs: Any) -> Tensor:
        from ..autograd.functional import value_and_grad

        loss, grads = value_and_grad(self.network, None, list(self.weights))(*inputs)
        if self.sens != 1.0:
            grads = tuple(g * self.sens for g in grads)
        self.optimizer(grads)
        return loss.detach()  # the loss before the update, as a value (its graph is spent)
