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
