"""What the in-place tests share (test_inplace_views, test_inplace_older_views, test_jit_view_writes):
Python Functions that write their argument (``mark_dirty``), and the views a write goes through. The
C++ twins are tests/cpp/inplace_view_ops.cpp (conftest's ``inplace_view_ops`` fixture)."""
from __future__ import annotations

from runtime.autograd import Function

__all__ = ["PyScale", "PyAdd", "VIEWS"]

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
