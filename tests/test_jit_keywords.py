"""A tensor passed by keyword under rt.jit (Function.apply(x, other=o), a Cell with bprop called as
cell(x, y=o)) is an input of the traced node: it was recorded as a constant attribute, so replays reused
the first call's tensor (9 instead of 15, no gradient for o). Found by this session's attack."""
import numpy as np
import runtime as rt
from runtime import Tensor, nn
from runtime.autograd import Function


class Mul(Function):
    @staticmethod
    def forward(ctx, x, other=None):
        ctx.save_for_backward(x, other)
        return Tensor(x.asnumpy() * other.asnumpy())

    @staticmethod
    def backward(ctx, g):
        x, o = ctx.saved_tensors
        return g * o, g * x


class MulCell(nn.Cell):
    def construct(self, x, y):
        return x * y

    def bprop(self, x, y, out, dout):
        return dout * y, dout * x


def test_a_tensor_keyword_is_an_input_of_the_traced_node_not_a_constant():
    cell = MulCell()
    for f in (rt.jit(lambda x, o: Mul.apply(x, other=o).sum()), rt.jit(lambda x, o: cell(x, y=o).sum())):
        for v in (3.0, 5.0):
            x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
            o = Tensor(np.array([v, v]), requires_grad=True)
            z = f(x, o)
            z.backward()
            assert (z.item(), x.grad.numpy().tolist(), o.grad.numpy().tolist()) == (3 * v, [v, v], [1.0, 2.0])
