"""``python -m opbuilder demo``: the design's example, end to end.

Builds custom_src/function_ops.cpp, uses its ``mul`` inside an ``nn.Cell``
and takes gradients with ``value_and_grad``. Expected output::

    out: 12.0
    grads[0]: (Tensor(shape=[], dtype=Float32, value= 6), Tensor(shape=[], dtype=Float32, value= 4))
    grads[1]: (Tensor(shape=[], dtype=Float32, value= 6),)
"""
from __future__ import annotations

from typing import Callable

from .examples import example_source

__all__ = ["run_demo"]


def run_demo(source: str = "function_ops.cpp", name: str = "my_ops", echo: Callable[[str], None] = print):
    """Run the example; returns (out, grads) so tests can check the values."""
    import runtime as rt
    from runtime import Parameter, Tensor, nn

    from . import CustomOpBuilder

    src = str(example_source(source))

    class MyNet(nn.Cell):
        def __init__(self):
            super().__init__()
            self.p = Parameter(2.0, requires_grad=True)
            self.my_ops = CustomOpBuilder(name, [src], backend="CPU").load()

        def construct(self, x, y):
            z = self.my_ops.mul(x, y)
            return self.my_ops.mul(z, self.p)

    x = Tensor(1.0, rt.float32) * 2
    y = Tensor(1.0, rt.float32) * 3
    net = MyNet()
    out, grads = rt.value_and_grad(net, grad_position=(0, 1), weights=net.trainable_params())(x, y)
    echo(f"out: {out}")
    echo(f"grads[0]: {grads[0]}")
    echo(f"grads[1]: {grads[1]}")
    return out, grads
