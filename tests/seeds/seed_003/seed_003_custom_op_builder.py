# Seed 003: CustomOpBuilder with the Function interface (forward and backward in C++), in an nn.Cell
# under value_and_grad. Changed from the seed: the imports (mindspore -> runtime) and backend "Ascend" ->
# "CPU" (this machine has no Ascend). custom_src/function_ops.cpp beside this script is the seed's C++
# as it stands, custom::CustomLaunchAclnn("aclnnMul", ...) included (ms_extension.h runs it on the host);
# tests/seeds/test_seeds.py checks it against the seed's code block (function_ops.seed.txt).
# Run from this folder, as the seed runs from its project folder: python seed_003_custom_op_builder.py
import numpy as np
import runtime as ms
from runtime import Tensor, Parameter, nn
from runtime.ops import CustomOpBuilder


class MyNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.p = Parameter(2.0, requires_grad=True)
        self.my_ops = CustomOpBuilder("my_ops", ['./custom_src/function_ops.cpp'], backend="CPU").load()

    def construct(self, x, y):
        z = self.my_ops.mul(x, y)
        return self.my_ops.mul(z, self.p)


x = Tensor(1.0, ms.float32) * 2
y = Tensor(1.0, ms.float32) * 3
net = MyNet()
grad_op = ms.value_and_grad(net, grad_position=(0, 1), weights=net.trainable_params())
out, grads = grad_op(x, y)
print('out:', out)
print('grads[0]:', grads[0])
print('grads[1]:', grads[1])
