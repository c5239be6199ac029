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
