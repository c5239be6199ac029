"""The methods of ``Tensor`` that run ops: operators, in-place writes, method forms, ``to``, ``backward``.

runtime/tensor.py holds a tensor's data and what needs no op; this module (imported by ``runtime.ops``,
so by ``import runtime``) attaches the rest to ``Tensor``, as HIPS autograd attaches its operators to
``ArrayBox``. So the imports point one way: ops import tensor.py, tensor.py imports no op.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .. import device as _device
from .. import dtypes as _dt
from ..tensor import Parameter, Tensor, detached
from . import math as _math
from . import writes as _writes
from .op_entry import breaks_trace, unary_method

__all__ = ["TensorMethods"]


def _leaks(what: str) -> str:
    """Why a read of a value stops a trace: the graph would keep the value as traced."""
    return f"{what} turns its value into a Python value, which a graph would keep as traced"


class TensorMethods:
    """The methods attached to ``Tensor`` (below); not a base class, never instantiated."""

    # ---- reads of the value: each stops a jit trace (the graph would keep the value as traced) ----
    @breaks_trace(_leaks("asnumpy() of a tensor"))
    def asnumpy(self) -> np.ndarray:
        """The data as a numpy array: shared on the CPU, copied to the host from a GPU."""
        return self._host()

    @breaks_trace(_leaks("item() of a tensor"))
    def item(self) -> Any:
        return self._data.item()

    @breaks_trace(_leaks("tolist() of a tensor"))
    def tolist(self) -> Any:
        return self._data.tolist()

    @breaks_trace(_leaks("np.asarray (or a numpy function) on a tensor"))
    def __array__(self, dtype: Any = None, copy: Optional[bool] = None) -> np.ndarray:
        if not isinstance(self._data, np.ndarray):
            raise TypeError(f"a tensor on {self.device} is not converted to numpy implicitly; call asnumpy() "
                            f"to copy it to the host")
        if dtype is not None and np.dtype(dtype) != self._data.dtype:
            return self._data.astype(dtype)
        if copy:
            return self._data.copy()
        return self._data

    @breaks_trace(_leaks("bool() of a tensor (an if or while on it)"))
    def __bool__(self) -> bool:
        return bool(self._data)

    @breaks_trace(_leaks("float() of a tensor"))
    def __float__(self) -> float:
        return float(self._data)

    @breaks_trace(_leaks("int() of a tensor"))
    def __int__(self) -> int:
        return int(self._data)

    @breaks_trace(_leaks("a tensor used as an index"))
    def __index__(self) -> int:
        d = self._data
        if type(d) is np.ndarray:
            return d.__index__()
        if d.ndim != 0 or d.dtype.kind not in "iu":  # CuPy arrays have no __index__: numpy's rule and message
            raise TypeError("only integer scalar arrays can be converted to a scalar index")
        return int(d)

    @unary_method("detach", stops_gradient=True)
    def detach(self) -> "Tensor":
        """A new leaf sharing this tensor's data and version counter, outside the graph. A jit trace
        records it as a node with no gradient through it: a replay detaches that call's tensor (held as
        a constant, the trace's own tensor would be reused by every later call)."""
        return detached(self)

    def to(self, device: str) -> "Tensor":
        """This tensor on ``device`` (itself when already there); differentiable, the gradient goes back."""
        return _math.to_device(self, _device.parse_device(device))

    def move_to(self, to: str, blocking: bool = True) -> "Tensor":
        """MindSpore's name: a copy on ``"CPU"`` or ``"GPU"`` (``blocking`` is accepted; copies are ordered
        on the current stream)."""
        return _math.to_device(self, _device.parse_device(to))

    @property
    def T(self) -> "Tensor":
        return _math.transpose(self)

    def astype(self, dtype: Any) -> "Tensor":
        return _math.cast(self, _dt.to_dtype(dtype))

    def backward(self, gradient: Any = None, retain_graph: Optional[bool] = None, create_graph: bool = False) -> None:
        """Accumulate d(self)/d(leaf) into ``leaf.grad`` for every leaf that requires grad."""
        from ..autograd.engine import backward  # the engine loads on first use (import runtime stays light)
        backward([self], None if gradient is None else [gradient],
                 retain_graph=retain_graph, create_graph=create_graph)

    # ---- arithmetic (differentiable) --------------------------------
    def __add__(self, o): return _math.add(self, o)
    def __radd__(self, o): return _math.add(o, self)
    def __sub__(self, o): return _math.sub(self, o)
    def __rsub__(self, o): return _math.sub(o, self)
    def __mul__(self, o): return _math.mul(self, o)
    def __rmul__(self, o): return _math.mul(o, self)
    def __truediv__(self, o): return _math.div(self, o)
    def __rtruediv__(self, o): return _math.div(o, self)
    def __matmul__(self, o): return _math.matmul(self, o)
    def __rmatmul__(self, o): return _math.matmul(o, self)
    def __pow__(self, o): return _math.pow(self, o)
    def __rpow__(self, o): return _math.pow(o, self)
    def __neg__(self): return _math.neg(self)
    def __pos__(self): return self
    def __getitem__(self, index): return _math.getitem(self, index)

    # ---- in place (same object, dtype, shape; version bumped; see ops/writes.py) ----
    def __setitem__(self, index, value): _writes.setitem(self, index, value)
    def __iadd__(self, o): return _writes.inplace_binary(self, o, np.add, "+")
    def __isub__(self, o): return _writes.inplace_binary(self, o, np.subtract, "-")
    def __imul__(self, o): return _writes.inplace_binary(self, o, np.multiply, "*")
    def __itruediv__(self, o): return _writes.inplace_binary(self, o, np.true_divide, "/")

    # ---- comparisons (not differentiable, give bool tensors) --------
    def __lt__(self, o): return _math.less(self, o)
    def __le__(self, o): return _math.less_equal(self, o)
    def __gt__(self, o): return _math.greater(self, o)
    def __ge__(self, o): return _math.greater_equal(self, o)
    def __eq__(self, o): return _math.equal(self, o)  # type: ignore[override]
    def __ne__(self, o): return _math.not_equal(self, o)  # type: ignore[override]

    # ---- method forms of common ops ---------------------------------
    def sum(self, axis=None, keepdims: bool = False): return _math.sum(self, axis, keepdims)
    def mean(self, axis=None, keepdims: bool = False): return _math.mean(self, axis, keepdims)
    def reshape(self, *shape): return _math.reshape(self, shape[0] if len(shape) == 1 else shape)
    def transpose(self, *axes): return _math.transpose(self, (axes[0] if len(axes) == 1 else axes) or None)
    def broadcast_to(self, shape): return _math.broadcast_to(self, shape)
    def exp(self): return _math.exp(self)
    def log(self): return _math.log(self)
    def sin(self): return _math.sin(self)
    def cos(self): return _math.cos(self)
    def tanh(self): return _math.tanh(self)
    def sigmoid(self): return _math.sigmoid(self)
    def relu(self): return _math.relu(self)
    def sqrt(self): return _math.sqrt(self)
    def abs(self): return _math.abs(self)


@breaks_trace(lambda self, *args, **kwargs: f"Parameter.set_data on {self.name or 'a Parameter'} (an in-place "
                                           f"write a graph does not hold)")
def set_data(self: Parameter, data: Any, slice_shape: bool = False) -> Parameter:
    """Replace the values, bumping the version like an in-place op (``Parameter._set_data`` says the
    rules); inside a jit trace it stops the trace, since a graph does not hold this write."""
    return self._set_data(data, slice_shape)


def _attach() -> None:
    """Puts every method and property of ``TensorMethods`` on ``Tensor`` (Parameter inherits them)."""
    for name, value in vars(TensorMethods).items():
        if callable(value) or isinstance(value, property):
            if callable(value):
                value.__qualname__ = f"Tensor.{name}"
            setattr(Tensor, name, value)
    set_data.__qualname__ = "Parameter.set_data"
    Parameter.set_data = set_data  # type: ignore[method-assign]


_attach()
