# Seed 002 (test_cpu_op.py): PyTorch ATen's leaky_relu called through an aot operator, CPU.
# Changed from the seed: the imports (mindspore -> runtime), and the Custom's func: the seed first builds
# leaky_relu.cpp into ./leaky_relu_cpu.so with torch's setup.py; here ops.Custom builds the same kind of
# source (custom_src/aot_torch_leaky_relu.cpp) itself, given torch's include and library paths.
# Run from the repository root: python tests/seeds/seed_002_aten_leaky_relu.py
import os

import numpy as np
import runtime as ms
from runtime.nn import Cell
import runtime.ops as ops
import torch

ms.set_context(device_target="CPU")

TORCH = os.path.dirname(torch.__file__)
ATEN = dict(cflags=["-std=c++20", "-isystem", os.path.join(TORCH, "include")],  # recent ATen headers need C++20
            ldflags=[f"-L{TORCH}/lib", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{TORCH}/lib"])


def LeakyRelu():
    return ops.Custom("./custom_src/aot_torch_leaky_relu.cpp:LeakyRelu", out_shape=lambda x : x,
                      out_dtype=lambda x : x, func_type="aot", **ATEN)


class Net(Cell):
    def __init__(self):
        super(Net, self).__init__()
        self.leaky_relu = LeakyRelu()

    def construct(self, x):
        return self.leaky_relu(x)


if __name__ == "__main__":
    x0 = np.array([[0.0, -0.1], [-0.2, 1.0]]).astype(np.float32)
    net = Net()
    output = net(ms.Tensor(x0))
    print(output)
