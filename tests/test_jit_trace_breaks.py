"""What a graph cannot hold stops the trace, and that signature runs eagerly with a warning naming the line:
a tensor's value turned into a Python value (if on a tensor, item(), asnumpy()) or a tensor written in place
outside an op (ops.assign, t[i] = v, t += v, set_data). Results and gradients then match PYNATIVE_MODE."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import runtime as rt
from runtime import Parameter, Tensor, jit, nn, ops
from runtime.autograd.gradcheck import gradcheck

HERE = __file__


@pytest.fixture
def graph_mode():
    rt.set_context(mode=rt.GRAPH_MODE)
    yield
    rt.set_context(mode=rt.PYNATIVE_MODE)


class Counter(nn.Cell):
    def __init__(self):
        super().__init__()
        self.count = Parameter(Tensor(np.zeros(1, np.float32)), name="count", requires_grad=False)

    def construct(self, x):
        ops.assign(self.count, self.count + 1)
        return self.count * x


def test_graph_mode_keeps_parameter_updates_with_assign(graph_mode):
    c = Counter()
    with pytest.warns(RuntimeWarning, match=r"^jit\(Counter\.construct\): not captured: at .*test_jit_trace_breaks"
                                            r"\.py:\d+, assign writes a tensor in place outside an op, which a "
                                            r"graph does not hold; this signature runs eagerly"):
        first = c(Tensor(np.ones(1, np.float32)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per signature
        later = [c(Tensor(np.ones(1, np.float32))).asnumpy()[0] for _ in range(2)]
    assert [first.asnumpy()[0], *later] == [1.0, 2.0, 3.0] and c.count.asnumpy()[0] == 3.0


class Branch(nn.Cell):
    def construct(self, x):
        if ops.sum(x) > 0:
            return x * 2
        return x * 3


class InPlace(nn.Cell):
    def construct(self, x):
        y = x * 1.0
        with rt.no_grad():
            y += 10
        return y * 2


class SetItem(nn.Cell):
    def construct(self, x):
        y = x * 1.0
        y[0] = x[1]
        return y


class Leak(nn.Cell):
    def construct(self, x):
        return x + Tensor(np.sum(x.asnumpy()))


@pytest.mark.parametrize("cell, what", [(Branch(), r"bool\(\) of a tensor \(an if or while on it\)"),
                                        (InPlace(), r"'\+=' writes a tensor in place"),
                                        (SetItem(), r"Tensor\.__setitem__ writes a tensor in place"),
                                        (Leak(), r"asnumpy\(\) of a tensor turns its value into a Python value")])
def test_graph_mode_results_follow_the_inputs_as_in_pynative(graph_mode, cell, what):
    xs = [np.array([1.0, 2.0]), np.array([-3.0, 1.0]), np.array([0.5, -4.0])]
    with pytest.warns(RuntimeWarning, match=what):
        got = [cell(Tensor(x)).asnumpy() for x in xs]
    rt.set_context(mode=rt.PYNATIVE_MODE)
    want = [cell(Tensor(x)).asnumpy() for x in xs]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


class Gated(nn.Cell):
    """A data-dependent branch around a captured sub-cell: the sub-cell is still a graph."""

    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(3, 2)
        self.scale = Parameter(Tensor(np.array([1.5], np.float32)), name="scale")

    def construct(self, x):
        h = self.dense(x)
        if float(ops.sum(h)) > 0:
            return h * self.scale
        return h * h


def test_graph_mode_gradients_after_a_stopped_trace_match_pynative(graph_mode):
    rt.set_seed(3)
    net = Gated()
    x = Tensor(np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32))
    fn = rt.value_and_grad(lambda t: ops.sum(net(t)), None, net.trainable_params())
    with pytest.warns(RuntimeWarning, match=r"float\(\) of a tensor"):
        loss, grads = fn(x)
    dense = net.dense._graph_jit
    assert dense.traces == 1 and dense.graph(net.dense, x).nodes  # the sub-cell is still a graph
    rt.set_context(mode=rt.PYNATIVE_MODE)
    loss_p, grads_p = fn(x)
    np.testing.assert_allclose(loss.asnumpy(), loss_p.asnumpy(), rtol=1e-6)
    assert len(grads) == 3
    for g, gp in zip(grads, grads_p):
        np.testing.assert_allclose(g.asnumpy(), gp.asnumpy(), rtol=1e-6)


def test_jit_with_a_python_value_runs_eagerly_and_has_no_graph():
    def f(x):
        if x.sum().item() > 0:
            return x * x
        return x * 3

    j = jit(f)
    x = Tensor(np.array([1.0, 2.0, 3.0]))
    with pytest.warns(RuntimeWarning, match=r"^jit\(.*f\): not captured: at .*:\d+, item\(\) of a tensor"):
        np.testing.assert_array_equal(j(x).asnumpy(), [1.0, 4.0, 9.0])
    np.testing.assert_array_equal(j(Tensor(np.array([-1.0, -1.0, -1.0]))).asnumpy(), [-3.0, -3.0, -3.0])
    with pytest.raises(RuntimeError, match=r"this signature has no graph; it runs eagerly because its trace "
                                           r"stopped: at .*, item\(\) of a tensor"):
        j.graph(x)
    gradcheck(j, [Tensor(np.array([0.3, -1.2, 2.0]))])


def test_a_users_except_exception_does_not_swallow_the_stop():
    def f(x):
        try:
            flag = bool(x.sum() > 0)
        except Exception:  # noqa: BLE001  (what a user may write)
            flag = True
        return x * 2 if flag else x * 3

    j = jit(f)
    with pytest.warns(RuntimeWarning, match="bool"):
        j(Tensor(np.array([1.0])))
    np.testing.assert_array_equal(j(Tensor(np.array([-1.0]))).asnumpy(), [-3.0])


def test_what_a_graph_holds_is_still_captured_without_a_warning(capsys):
    def f(x, w):
        print("tracing", x)  # printing shows the traced values and does not stop the trace
        return ops.sum(x * w, axis=0) + x.shape[0]

    j = jit(f)
    x, w = Tensor(np.ones((2, 3))), Tensor(np.full(3, 2.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(j(x, w).asnumpy(), [6.0, 6.0, 6.0])
        np.testing.assert_array_equal(j(x * 2, w).asnumpy(), [10.0, 10.0, 10.0])
    assert j.traces == 1 and capsys.readouterr().out.count("tracing") == 1
