"""What the in-place tests share (test_inplace_views, test_inplace_older_views, test_jit_view_writes,
test_jit_saved_views): Python Functions that write their argument (``mark_dirty``) or save it, the views
a write goes through, and central differences. The C++ twins are tests/cpp/inplace_view_ops.cpp
(conftest's ``inplace_view_ops`` fixture)."""
from __future__ import annotations

import numpy as np

from runtime import Tensor
from runtime.autograd import Function

__all__ = ["PyScale", "PyAdd", "PySquare", "VIEWS", "central"]

# a view of a 6-element base, as each framework spells it (runtime and torch alike)
VIEWS = {
    "slice": lambda a: a[1:],
    "step": lambda a: a[::2],
    "reshape": lambda a: a.reshape(3, 2),
    "reshape_then_row": lambda a: a.reshape(3, 2)[1],
    "transpose": lambda a: a.reshape(2, 3).T,
}


class PyScale(Function):
    """x *= k through numpy, marked dirty after the write."""

    @staticmethod
    def forward(ctx, x, k):
        a = x.asnumpy()
        a *= k
        ctx.mark_dirty(x)
        ctx.k = k
        return x

    @staticmethod
    def backward(ctx, g):
        return g * ctx.k, None


class PyAdd(Function):
    """x += y through numpy, marked dirty."""

    @staticmethod
    def forward(ctx, x, y):
        a = x.asnumpy()
        a += y.asnumpy()
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, g


class PySquare(Function):
    """x * x, a Python Function that reads (not writes) its argument and saves it."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return Tensor(x.asnumpy() ** 2)

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * 2.0 * x


def central(f, x, eps=1e-6):
    """The gradient of the scalar function ``f`` at the float64 array ``x`` by central differences."""
    g = np.zeros_like(x)
    for i in range(x.size):
        d = np.zeros_like(x)
        d[i] = eps
        g[i] = (f(x + d) - f(x - d)) / (2 * eps)
    return g
