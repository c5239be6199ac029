"""``ops.print_`` and ``ops.Print``: print values the way MindSpore prints them.

A tensor prints as MindSpore's ``Tensor.__repr__`` does: a header with its
shape and dtype, then the values, floating-point ones in ``%.8e`` form::

    Tensor(shape=[3], dtype=Float32, value= [ 4.00000000e+00,  4.00000000e+00,  4.00000000e+00])
    Tensor(shape=[], dtype=Float32, value= 0.7)
    Tensor(shape=[2, 1], dtype=Int32, value=
    [[1],
     [1]])

Strings and numbers print as Python prints them; each argument goes on a line
of its own.
"""
from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ..tensor import Tensor

__all__ = ["print_", "Print", "format_value"]

_FLOAT_FORMAT = {"float_kind": lambda v: f"{v: .8e}"}


def _scalar(arr: np.ndarray) -> str:
    v = arr[()]
    if arr.dtype.kind == "f":
        return np.format_float_positional(v, trim="-")  # the shortest repr of the value in its own dtype
    return str(v.item())


def format_tensor(t: Tensor) -> str:
    """One tensor as MindSpore prints it."""
    arr = t._host()  # a GPU tensor's values, copied to the host
    head = f"Tensor(shape={list(arr.shape)}, dtype={t.dtype}, value="
    if arr.ndim == 0:
        return f"{head} {_scalar(arr)})"
    if arr.dtype.kind == "V":  # bfloat16: printed as the float32 values it holds exactly
        arr = arr.astype(np.float32)
    body = np.array2string(arr, separator=", ", max_line_width=sys.maxsize,
                           formatter=_FLOAT_FORMAT if arr.dtype.kind == "f" else None)
    return f"{head}{' ' if arr.ndim == 1 else chr(10)}{body})"


def format_value(value: Any, index: int = 0) -> str:
    """A value ``print_`` accepts, as text; TypeError for anything else."""
    if isinstance(value, Tensor):
        return format_tensor(value)
    if isinstance(value, (str, bool, int, float)):
        return str(value)
    if isinstance(value, (tuple, list)):
        items = [format_value(v, index) for v in value]
        if isinstance(value, list):
            return f"[{', '.join(items)}]"
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    raise TypeError(f"print_: input {index} is a {type(value).__name__}; print_ takes Tensors, bool, int, float, "
                    f"str, and tuples or lists of them")


def print_(*input_x: Any) -> None:
    """Print each argument on a line of its own, tensors as MindSpore prints them."""
    lines = [format_value(v, i) for i, v in enumerate(input_x)]  # every argument checked before any is printed
    for line in lines:
        print(line)


class Print:
    """The primitive form of ``print_``: ``ops.Print()(x, y)``."""

    def __call__(self, *input_x: Any) -> None:
        print_(*input_x)
