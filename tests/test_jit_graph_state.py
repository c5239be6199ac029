"""GRAPH_MODE keys a cell's graph on a snapshot of the cell tree's attributes: a plain attribute changed after
the first call (a float, a flag, a list changed in place, an int for a float), a swapped tensor attribute or
a replaced sub-cell is a new trace, anywhere in the tree, so results and gradients match PYNATIVE_MODE;
the same values reuse the graph."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import runtime as rt
from runtime import Parameter, Tensor, mint, nn, ops

RNG = np.random.default_rng(41)


class Attention(nn.Cell):
    """A softmax with a temperature, an optional additive bias (a plain Tensor attribute), a list of scales."""

    def __init__(self):
        super().__init__()
        self.w = Parameter(Tensor(RNG.standard_normal(4)), name="w")
        self.temperature = 1.0
        self.bias = Tensor(RNG.standard_normal(4))
        self.use_bias = True
        self.scales = [1.0, 2.0]
        self.act = nn.Tanh()

    def construct(self, x):
        h = self.act(x * self.w) * self.scales[0] / self.temperature
        if self.use_bias:
            h = h + self.bias
        return mint.softmax(h, -1) * self.scales[1]


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.att = Attention()
        self.k = 1.0

    def construct(self, x):
        return mint.sum(self.att(x) * Tensor(np.arange(4.0)) * self.k)


def value_and_grads(net, x, mode):
    rt.set_context(mode=mode)
    try:
        v, (gx, gw) = rt.value_and_grad(net, grad_position=0, weights=net.trainable_params())(x)
    finally:
        rt.set_context(mode=rt.PYNATIVE_MODE)
    return [v.asnumpy(), gx.asnumpy()] + [g.asnumpy() for g in gw]


def assert_graph_matches_pynative(net, x):
    want = value_and_grads(net, x, rt.PYNATIVE_MODE)
    for _ in range(2):  # the call that traces (when the snapshot is new) and a cached one
        for got, exp in zip(value_and_grads(net, x, rt.GRAPH_MODE), want):
            np.testing.assert_allclose(got, exp, rtol=1e-12, atol=1e-15)


CHANGES = {
    "float_attribute": lambda net: setattr(net.att, "temperature", 100.0),
    "tensor_attribute_swapped": lambda net: setattr(net.att, "bias", Tensor(RNG.standard_normal(4) * 5)),
    "bool_flag": lambda net: setattr(net.att, "use_bias", False),
    "list_changed_in_place": lambda net: net.att.scales.__setitem__(1, -3.0),
    "sub_cell_replaced": lambda net: setattr(net.att, "act", nn.Sigmoid()),
    "top_cell_attribute": lambda net: setattr(net, "k", -2.0),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_an_attribute_changed_after_the_first_graph_mode_call_is_seen(change):
    net, x = Net(), Tensor(RNG.standard_normal(4))
    assert_graph_matches_pynative(net, x)
    traces = net._graph_jit.traces
    CHANGES[change](net)
    assert_graph_matches_pynative(net, x)
    assert net._graph_jit.traces == traces + 1


def test_equal_attribute_values_reuse_the_graph_and_an_int_for_a_float_does_not():
    class Scale(nn.Cell):
        def __init__(self):
            super().__init__()
            self.k = 2

        def construct(self, x):
            return x * self.k

    c, x = Scale(), Tensor(np.array([3, 4], np.int32))
    rt.set_context(mode=rt.GRAPH_MODE)
    try:
        assert str(c(x).dtype) == "Int32"
        c.k = 2.0
        assert str(c(x).dtype) == str((x * 2.0).dtype) == "Float32"
        c.k = 2
        c(x)
        c.k = float("2")  # a new object, the same exact value: the same graph
        np.testing.assert_array_equal(c(x).asnumpy(), [6.0, 8.0])
        assert c._graph_jit.traces == 2
    finally:
        rt.set_context(mode=rt.PYNATIVE_MODE)


def test_a_tensor_attribute_written_in_place_is_seen_without_a_new_trace():
    net, x = Net(), Tensor(RNG.standard_normal(4))
    assert_graph_matches_pynative(net, x)
    traces = net._graph_jit.traces
    ops.assign(net.att.bias, Tensor(RNG.standard_normal(4)))  # the graph holds the tensor by reference
    assert_graph_matches_pynative(net, x)
    assert net._graph_jit.traces == traces


def test_a_cell_whose_construct_changes_its_attributes_every_call_runs_as_pynative():
    class Counter(nn.Cell):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def construct(self, x):
            self.calls += 1
            return x * self.calls

    c, x = Counter(), Tensor(np.array([1.0]))
    rt.set_context(mode=rt.GRAPH_MODE)
    try:
        got = [c(x).asnumpy()[0]]  # traced; the trace changed `calls`
        with pytest.warns(RuntimeWarning, match=r"^GRAPH_MODE: Counter\.construct changes the cell's attributes "
                                                r"on every trace; it runs as in PYNATIVE_MODE from now on$") as w:
            got.append(c(x).asnumpy()[0])  # traced again for the new `calls`, which it changed again
        assert [r.filename for r in w] == [__file__]  # it names the line that called the cell
        got += [c(x).asnumpy()[0] for _ in range(4)]
    finally:
        rt.set_context(mode=rt.PYNATIVE_MODE)
    assert got == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0] and c.calls == 6
    assert c._graph_jit.traces == 2


def test_a_sub_cell_getting_its_own_graph_does_not_change_its_parents_signature():
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(p=0.5)

        def construct(self, x):
            return self.drop(x) * 2.0

    net, ones = Net(), Tensor(np.ones(16))
    net.set_train(True)
    rt.set_context(mode=rt.GRAPH_MODE)
    try:
        with pytest.warns(RuntimeWarning, match=r"^jit\(Net\.construct\): not captured: .*Dropout in training"):
            net(ones)  # Net's trace stops in Dropout; that call goes on eagerly (each op once)
        with pytest.warns(RuntimeWarning, match=r"^jit\(Dropout\.construct\): not captured"):
            net(ones)  # Net runs eagerly: it calls Dropout through GRAPH_MODE, its own jit, which stops
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the same signature: no second warning, no new trace
            for _ in range(3):
                assert set(np.unique(net(ones).asnumpy())) <= {0.0, 4.0}
    finally:
        rt.set_context(mode=rt.PYNATIVE_MODE)
    assert len(net._graph_jit._cache) == 1


def test_a_cell_whose_stopped_trace_changes_its_attributes_every_call_runs_as_pynative():
    class Counter(nn.Cell):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def construct(self, x):
            s = float(mint.sum(x).item())  # item(): the trace stops (before the write below)
            self.calls += 1
            return x * s * self.calls

    c, x = Counter(), Tensor(np.array([2.0]))
    rt.set_context(mode=rt.GRAPH_MODE)
    try:
        with pytest.warns(RuntimeWarning, match="not captured"):
            got = [c(x).asnumpy()[0]]
        with pytest.warns(RuntimeWarning) as caught:  # its trace stops again, and it changed `calls` again
            got.append(c(x).asnumpy()[0])
        assert [str(w.message) for w in caught][-1] == ("GRAPH_MODE: Counter.construct changes the cell's "
                                                        "attributes on every trace; it runs as in PYNATIVE_MODE "
                                                        "from now on")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got += [c(x).asnumpy()[0] for _ in range(3)]
    finally:
        rt.set_context(mode=rt.PYNATIVE_MODE)
    assert got == [4.0, 8.0, 12.0, 16.0, 20.0] and len(c._graph_jit._cache) == 2


SCALE = 2.0  # a module global read by GlobalReader.construct


class GlobalReader(nn.Cell):
    shift = 1.0  # a class attribute read through self

    def construct(self, x):
        return mint.exp(x * SCALE) + self.shift


@pytest.mark.parametrize("change", ["global", "class_attribute"])
def test_a_global_or_class_attribute_read_by_construct_is_part_of_the_signature(change):
    global SCALE
    net, x = GlobalReader(), Tensor(RNG.standard_normal(3))
    assert_graph_matches_pynative(net, x)
    saved = SCALE, GlobalReader.shift
    try:
        if change == "global":
            SCALE = -1.5
        else:
            GlobalReader.shift = 4.0
        assert_graph_matches_pynative(net, x)
        assert net._graph_jit.traces == 2
    finally:
        SCALE, GlobalReader.shift = saved
