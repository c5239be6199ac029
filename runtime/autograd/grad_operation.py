"""MindSpore's older autodiff spellings over ``value_and_grad``: ``GradOperation``, ``stop_gradient``.

A script ported from MindSpore often writes ``ops.GradOperation(get_all=True)(net)(x, y)`` or
``ops.GradOperation(get_by_list=True, sens_param=True)(net, weights)(x, sens)``. Each is one call of
``runtime.grad`` with the positions and weights it names; ``sens_param`` takes the last input as the
output's gradient (MindSpore's sensitivity), which ``grad`` otherwise sets to ones.
"""
from __future__ import annotations

from typing import Any, Callable

from .. import tensor as _tensor

__all__ = ["GradOperation", "stop_gradient"]


class GradOperation:
    """``GradOperation(get_all=False, get_by_list=False, sens_param=False)(fn, weights=None)``: a function
    returning the gradients of ``fn``'s output with respect to its first input (``get_all``: all its
    inputs, a tuple), to ``weights`` (``get_by_list``: a tuple), or both (``(inputs, weights)``)."""

    def __init__(self, get_all: bool = False, get_by_list: bool = False, sens_param: bool = False) -> None:
        for name, value in (("get_all", get_all), ("get_by_list", get_by_list), ("sens_param", sens_param)):
            if not isinstance(value, bool):
                raise TypeError(f"GradOperation: {name} must be a bool, got {type(value).__name__}")
        self.get_all, self.get_by_list, self.sens_param = get_all, get_by_list, sens_param

    def __call__(self, fn: Callable[..., Any], weights: Any = None) -> Callable[..., Any]:
        if self.get_by_list and weights is None:
            raise TypeError("GradOperation(get_by_list=True) needs the weights: GradOperation(get_by_list=True)(net, "
                            "weights), weights a ParameterTuple or a list of Parameters (net.trainable_params())")
        from .functional import grad

        if self.get_by_list:  # once: a generator (net.get_parameters()) is drained by its first pass
            weights = weights if isinstance(weights, _tensor.Tensor) else list(weights)

        def gradients(*args: Any, **kwargs: Any) -> Any:
            target: Callable[..., Any] = fn
            if self.sens_param:
                if not args:
                    raise TypeError("GradOperation(sens_param=True): the last input is the output's gradient "
                                    "(sens), and none was given")
                *args, sens = args  # type: ignore[assignment]
                target = _weighted(fn, sens)
            if not args and not (self.get_by_list and not self.get_all):
                raise TypeError(f"GradOperation: {getattr(fn, '__name__', 'the function')} was called with no "
                                f"input to differentiate")
            position: Any = tuple(range(len(args))) if self.get_all else None if self.get_by_list else 0
            out = grad(target, position, weights if self.get_by_list else None)(*args, **kwargs)
            if self.get_all and len(args) == 1:  # all inputs' gradients: a tuple, even of one (grad unwraps it)
                out = ((out[0],), out[1]) if self.get_by_list else (out,)
            return out

        return gradients


def _weighted(fn: Callable[..., Any], sens: Any) -> Callable[..., Any]:
    """``fn`` whose output (a Tensor, or a tuple of them) is reduced to ``sum(out * sens)``: its gradient is
    the vector-Jacobian product with ``sens`` (one Tensor per output)."""
    def reduced(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        senses = sens if isinstance(sens, (tuple, list)) else (sens,)
        if len(senses) != len(outs):
            raise ValueError(f"GradOperation(sens_param=True): {len(senses)} sens for {len(outs)} outputs")
        total = None
        for o, s in zip(outs, senses):
            s = s if isinstance(s, _tensor.Tensor) else _tensor.Tensor(s, o.dtype)
            if tuple(s.shape) != tuple(o.shape):
                raise ValueError(f"GradOperation(sens_param=True): sens of shape {list(s.shape)} for an output "
                                 f"of shape {list(o.shape)}")
            term = (o * s).sum()
            total = term if total is None else total + term
        return total

    return reduced


def stop_gradient(x: Any) -> Any:
    """``x`` with no history (``Tensor.detach``), as MindSpore's ``ops.stop_gradient``; tuples and lists
    item by item; anything else (a number) as it is."""
    if isinstance(x, (tuple, list)):
        return type(x)(stop_gradient(v) for v in x)
    return x.detach() if isinstance(x, _tensor.Tensor) else x
