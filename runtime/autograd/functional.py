"""``value_and_grad`` and ``grad`` with MindSpore's calling conventions.

The inputs at ``grad_position`` become fresh leaves (or, inside an outer
``value_and_grad``, differentiable aliases, so gradients of gradients work);
the function runs with recording on; the engine returns gradients for those
inputs and the weights, zeros where an input does not reach the output.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Collection, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import engine
from . import grad_mode as _gm
from .. import device as _device
from .. import tensor as _tensor  # a module object: Tensor is looked up when first needed
from ..dtypes import GRAD_KINDS
from ..ops.op_entry import breaks_trace

__all__ = ["value_and_grad", "grad"]

Position = Optional[Union[int, Sequence[int]]]


class _Depth(threading.local):
    n = 0


_depth = _Depth()


def _positions(grad_position: Position) -> Tuple[Optional[Tuple[int, ...]], bool]:
    if grad_position is None:
        return None, False
    if isinstance(grad_position, (int, np.integer)) and not isinstance(grad_position, bool):
        return (int(grad_position),), True
    if isinstance(grad_position, (tuple, list)) and grad_position and all(
            isinstance(p, (int, np.integer)) and not isinstance(p, bool) for p in grad_position):
        # one position in a tuple gives the gradient itself, as MindSpore does (seed 004:
        # grad(f, grad_position=(0,)) prints [3. 2. 1.])
        return tuple(int(p) for p in grad_position), len(grad_position) == 1
    raise TypeError(f"grad_position must be an int, a non-empty tuple of ints, or None; got {grad_position!r}")


def _weights(weights: Any) -> Tuple[Optional[List[Any]], bool]:
    Tensor = _tensor.Tensor
    if weights is None:
        return None, False
    if isinstance(weights, Tensor):
        return [weights], True
    ws = list(weights)
    for w in ws:
        if not isinstance(w, Tensor):
            raise TypeError(f"weights must be Parameters (or Tensors), got {type(w).__name__}")
    return ws, False


def _grad_input(value: Any, position: int):
    """A tensor standing for input ``position`` that the engine can differentiate to."""
    Tensor = _tensor.Tensor
    if not isinstance(value, Tensor):
        raise TypeError(f"the input at grad_position {position} must be a Tensor, got {type(value).__name__}")
    if value.requires_grad and _gm._state.enabled:  # keep the link to the outer graph
        from ..ops import math as m
        return m.reshape(value, value.shape)
    t = _tensor.detached(value)  # over the input's memory, and its version counter
    if value._data.dtype.kind in GRAD_KINDS:
        t.requires_grad = True
    return t


def _constant(value: Any, weights: Collection[int]) -> Any:
    """A tensor input without its history (weights and other values unchanged)."""
    if isinstance(value, _tensor.Tensor) and (value.requires_grad or value._node is not None) \
            and not isinstance(value, _tensor.Parameter) and id(value) not in weights:
        return _tensor.detached(value)
    return value


def _heads(out: Any, has_aux: bool) -> List[Any]:
    Tensor = _tensor.Tensor
    if has_aux:
        if not isinstance(out, (tuple, list)) or len(out) < 1:
            raise TypeError("with has_aux=True the function must return a tuple (output, aux...)")
        out = out[0]
    items = list(out) if isinstance(out, (tuple, list)) else [out]
    for o in items:
        if not isinstance(o, Tensor):
            raise TypeError(f"the function to differentiate must return Tensors, got {type(o).__name__}")
    return items


def _run(fn: Callable, positions, weights, has_aux: bool, args: tuple, kwargs: dict):
    args = list(args)
    targets = []
    # a graph of the gradients is built inside an outer value_and_grad, or when
    # an input already takes part in a graph (gradcheck of a gradient, say)
    nested = _depth.n > 0
    n = len(args)
    if positions is not None:
        for p in positions:
            if not -n <= p < n:
                raise ValueError(f"grad_position {p} is out of range: the function was called with "
                                 f"{n} positional inputs")
            nested = nested or (getattr(args[p], "requires_grad", False) and _gm._state.enabled)
            args[p] = _grad_input(args[p], p)
            targets.append(args[p])
    if not nested:
        # At the top level the other inputs are constants of fn (as in MindSpore): their
        # history is neither followed (a weight reached through them is not counted) nor freed.
        keep = {id(w) for w in weights} if weights else ()
        at = () if positions is None else {p % n for p in positions}
        for i in range(n):
            if i not in at:
                args[i] = _constant(args[i], keep)
        if kwargs:
            kwargs = {k: _constant(v, keep) for k, v in kwargs.items()}
    depth = _depth
    depth.n += 1
    state = _gm._state
    prev_mode = state.enabled
    state.enabled = True
    try:
        out = fn(*args, **kwargs)
    finally:
        state.enabled = prev_mode
        depth.n -= 1
    heads = [h for h in _heads(out, has_aux) if h.requires_grad]
    all_targets = targets + weights if weights else targets
    if heads:
        seeds = [engine._ones(h._data.shape, h._data.dtype, h._data) for h in heads]
        grads = engine.run_backward(heads, seeds, all_targets, nested, nested)
    else:
        grads = [None] * len(all_targets)
    Tensor = _tensor.Tensor
    for i, g in enumerate(grads):
        if g is None:
            t = all_targets[i]._data
            grads[i] = Tensor._from_array(_device.array_module(t).zeros(t.shape, dtype=t.dtype))
    n = len(targets)
    if not nested:  # the value and aux come back as values (MindSpore's stop_gradient on aux): kept, as in a
        out = _values(out)  # list of a step's logits, they would keep that step's graph alive
    return out, grads[:n], grads[n:]


def _values(out: Any) -> Any:
    """``out`` (a Tensor, or a tuple, list or dict of them) without history; Parameters as they are."""
    if isinstance(out, dict):
        return type(out)((k, _values(v)) for k, v in out.items())
    if isinstance(out, (tuple, list)):
        items = [_values(o) for o in out]
        return type(out)(*items) if hasattr(out, "_fields") else type(out)(items)  # (a namedtuple's fields)
    Tensor = _tensor.Tensor
    if isinstance(out, Tensor) and not isinstance(out, _tensor.Parameter) and (out.requires_grad or
                                                                                out._node is not None):
        return _tensor.detached(out)
    return out


def _shape_result(positions, single_pos, weights, single_w, in_grads, w_grads):
    ig = None
    if positions is not None:
        ig = in_grads[0] if single_pos else tuple(in_grads)
    if weights is None:
        return ig
    wg = w_grads[0] if single_w else tuple(w_grads)
    if positions is None:
        return wg
    return (ig, wg)


def _differentiator(fn: Callable, grad_position: Position, weights: Any, has_aux: bool, api: str):
    """``(*args) -> (output, shaped gradients)``: the one body of value_and_grad and grad."""
    positions, single_pos = _positions(grad_position)
    ws, single_w = _weights(weights)
    if positions is None and ws is None:
        raise ValueError(f"{api} needs grad_position or weights (both are None)")

    # the gradient's leaves are made outside the ops: a graph would keep it
    @breaks_trace(f"{api} inside a traced function computes its gradient with the autograd engine, which a graph "
                  f"would keep as traced")
    def run(args: tuple, kwargs: dict):
        out, ig, wg = _run(fn, positions, ws, has_aux, args, kwargs)
        return out, _shape_result(positions, single_pos, ws, single_w, ig, wg)

    return run


def value_and_grad(fn: Callable, grad_position: Position = 0, weights: Any = None,
                   has_aux: bool = False) -> Callable:
    """``fn`` -> a function returning ``(fn(*args), gradients)``.

    grad_position: int -> one gradient; tuple -> tuple; None -> weights only.
    weights: a Parameter or a list of them; with inputs too the gradients are
    ``(input_grads, weight_grads)``. has_aux: only the first output is
    differentiated; the value is still the whole output.
    """
    run = _differentiator(fn, grad_position, weights, has_aux, "value_and_grad")

    def value_and_grad_fn(*args: Any, **kwargs: Any):
        return run(args, kwargs)

    return value_and_grad_fn


def grad(fn: Callable, grad_position: Position = 0, weights: Any = None, has_aux: bool = False) -> Callable:
    """Like ``value_and_grad`` but returns only the gradients (``(grads, aux)`` with has_aux)."""
    run = _differentiator(fn, grad_position, weights, has_aux, "grad")

    def grad_fn(*args: Any, **kwargs: Any):
        out, g = run(args, kwargs)
        return (g, tuple(out[1:])) if has_aux else g

    return grad_fn
