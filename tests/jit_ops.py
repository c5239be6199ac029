"""Operators shared by the jit tests."""
from runtime import Tensor
from runtime.autograd import Function


class Cube(Function):
    """x ** 3 as a Python autograd.Function: an op with its own backward (an opaque node to jit)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return Tensor(x.asnumpy() ** 3)

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * 3 * x * x


class CountedCube(Function):
    """x ** 3 counting its forwards (``CountedCube.forwards``): a jitted call must run it once, as eagerly."""

    forwards = 0

    @staticmethod
    def forward(ctx, x):
        CountedCube.forwards += 1
        ctx.save_for_backward(x)
        ctx.scale = 3.0  # a plain value only forward set
        return Tensor(x.asnumpy() ** 3)

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * ctx.scale * x * x


class Twice(Function):
    """k * x returned twice (``return o, o``: one tensor at two positions). Its backward weighs output 0's
    gradient by k and output 1's by w (w == k: the true derivative), so a test sees where each went."""

    @staticmethod
    def forward(ctx, x, k, w):
        ctx.k, ctx.w = k, w
        o = Tensor(x.asnumpy() * k)
        return o, o

    @staticmethod
    def backward(ctx, g0, g1):
        return g0 * ctx.k + g1 * ctx.w, None, None
