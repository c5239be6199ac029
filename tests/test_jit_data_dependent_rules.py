"""Rules whose masks depend on the values (clip, max/min, maximum/minimum, argmax) under jit: traced once
and replayed, they were built with numpy from the first call's values and replayed as constants, so later
calls got the first call's gradient (or index), silently, in GRAPH_MODE training too. Each call now
matches eager."""
from __future__ import annotations

import numpy as np
import pytest

import runtime as rt
from runtime import Tensor, mint, nn, ops

A = np.array([0.5, 3.0, -3.0], np.float32)
B = np.array([3.0, -3.0, 0.5], np.float32)

FUNCS = {
    "clip": lambda x: ops.sum(ops.clip(x, -1.0, 2.0)),
    "clip_tensor_bound": lambda x: ops.sum(ops.clip(x, Tensor(np.full(3, -1.0, np.float32)), 2.0)),
    "max": lambda x: mint.max(x),
    "min": lambda x: mint.min(x),
    "ops_max": lambda x: ops.max(x)[0],
    "maximum": lambda x: ops.sum(ops.maximum(x, 0.5)),
    "minimum": lambda x: ops.sum(ops.minimum(x, Tensor(np.float32([1.0, 0.0, 0.5])))),
    "max_dim": lambda x: ops.sum(ops.max(ops.reshape(x, (1, 3)) * 1.0, 1)[0]),
}


@pytest.mark.parametrize("level", ["O0", pytest.param("O1", marks=pytest.mark.build)])  # O1 compiles fused kernels
@pytest.mark.parametrize("name", sorted(FUNCS))
def test_a_jitted_gradient_follows_each_calls_values(name, level):
    f = FUNCS[name]
    jf = rt.jit(f, jit_level=level)
    for x in (A, B, A, -B):
        want = rt.grad(f)(Tensor(x))
        got = rt.grad(jf)(Tensor(x))
        np.testing.assert_array_equal(got.asnumpy(), want.asnumpy(), err_msg=f"{name} at {x}")


def test_a_jitted_argmax_is_each_calls_index():
    j = rt.jit(lambda x: ops.argmax(x) + 0, jit_level="O0")
    assert [int(j(Tensor(x)).asnumpy()) for x in (A, B, A)] == [1, 0, 1]
    jd = rt.jit(lambda x: ops.max(x, 0)[1] * 1)
    assert [int(jd(Tensor(x)).asnumpy()) for x in (A, B)] == [1, 0]


def test_graph_mode_training_through_clip_gets_each_steps_gradient():
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = nn.Dense(3, 2)

        def construct(self, x):
            return ops.sum(ops.clip(self.fc(x), -0.5, 0.5))

    rt.set_seed(0)
    net = Net()
    xs = [Tensor(np.array([[1.0, -2.0, 0.5]], np.float32)), Tensor(np.array([[-3.0, 2.0, 1.5]], np.float32))]
    want = [rt.grad(net, None, net.trainable_params())(x) for x in xs]
    rt.set_context(mode=rt.GRAPH_MODE)
    try:
        got = [rt.grad(net, None, net.trainable_params())(x) for x in xs]
    finally:
        rt.set_context(mode=rt.PYNATIVE_MODE)
    for w, g in zip(want, got):
        for a, b in zip(w, g):
            np.testing.assert_allclose(b.asnumpy(), a.asnumpy(), rtol=1e-6)


def test_a_replayed_output_requires_grad_only_where_a_gradient_flows():
    """Replays marked every float output requires_grad (eager: only those that depend on an input that
    requires grad), so backward() through one succeeded with no gradient instead of raising."""
    f = rt.jit(lambda x, y: (x * 2, y * 3, ops.argmax(y) + 0, (y * 1).detach() * 2, y), jit_level="O0")
    x, y = Tensor(np.float32([1, 2])), Tensor(np.float32([3, 4]), requires_grad=True)
    for _ in range(3):  # the first call runs eagerly and records; the others replay
        outs = f(x, y)
        assert [o.requires_grad for o in outs] == [False, True, False, False, True]
    (outs[1].sum() + outs[4].sum()).backward()
    assert y.grad.asnumpy().tolist() == [4.0, 4.0]
    with pytest.raises(RuntimeError, match="does not require grad"):
        outs[0].sum().backward()
