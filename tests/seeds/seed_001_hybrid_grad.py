# Seed 001 (test_grad.py): a hybrid ("akg") square op whose bprop is another hybrid op, square_grad.
# CPU variant. Changed from the seed: the imports (mindspore -> runtime) and device_target "GPU" -> "CPU".
# GRAPH_MODE is set as in the seed. The forward reads its uninitialized output (the seed's own bug), so only
# the gradient is defined; that is what the script prints.
# Run from the repository root: python tests/seeds/seed_001_hybrid_grad.py
import numpy as np
import runtime as ms
from runtime.nn import Cell
import runtime.ops as ops

ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")

# 自定义算子正向实现
def square(x):
    y = output_tensor(x.shape, x.dtype)
    for i0 in range(x.shape[0]):
        y[i0] = y[i0] * y[i0]
    return y

# 自定义算子反向实现
def square_grad(x, dout):
    dx = output_tensor(x.shape, x.dtype)
    for i0 in range(x.shape[0]):
        dx[i0] = 2.0 * x[i0]
    for i0 in range(x.shape[0]):
        dx[i0] = dx[i0] * dout[i0]
    return dx

# 反向传播函数
def bprop():
    op = ops.Custom(square_grad, lambda x, _: x, lambda x, _: x, func_type="akg")

    def custom_bprop(x, out, dout):
        dx = op(x, dout)
        return (dx,)

    return custom_bprop

class Net(Cell):
    def __init__(self):
        super(Net, self).__init__()
        # 定义akg类型的自定义算子,并提供反向传播函数
        self.op = ops.Custom(square, lambda x: x, lambda x: x, bprop=bprop(), func_type="akg")

    def construct(self, x):
        return self.op(x)

if __name__ == "__main__":
    x = np.array([1.0, 4.0, 9.0]).astype(np.float32)
    dx = ms.grad(Net())(ms.Tensor(x))
    print(dx)
