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
    with pytest.warns(RuntimeWarning, match=r"float\(\) of a tensor") as caught:
        loss, grads = fn(x)
    assert [str(w.message).split(":")[0] for w in caught] == ["jit(Gated.construct)"]
    # the call that traced ran the sub-cell inside its trace (each op once); the signature then runs
    # eagerly, and the sub-cell called from it is still a graph
    again = fn(x)
    assert net.dense._graph_jit.traces == 1
    rt.set_context(mode=rt.PYNATIVE_MODE)
    loss_p, grads_p = fn(x)
    for lo, gs in ((loss, grads), again):
        np.testing.assert_allclose(lo.asnumpy(), loss_p.asnumpy(), rtol=1e-6)
        assert len(gs) == 3
        for g, gp in zip(gs, grads_p):
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


def test_a_tensor_index_grad_inside_and_dropout_in_training_stop_the_trace(graph_mode):
    from runtime import mint
    rt.set_context(mode=rt.PYNATIVE_MODE)
    take = jit(lambda x, idx: x[idx])
    x = Tensor(np.arange(5.0))
    with pytest.warns(RuntimeWarning, match="a tensor used as an index"):
        np.testing.assert_array_equal(take(x, Tensor(np.array([0, 1]))).asnumpy(), [0.0, 1.0])
    np.testing.assert_array_equal(take(x, Tensor(np.array([3, 4]))).asnumpy(), [3.0, 4.0])
    inner = jit(lambda t: rt.grad(lambda u: mint.sum(mint.sin(u)))(t))
    with pytest.warns(RuntimeWarning, match="grad inside a traced function"):
        inner(Tensor(np.array([0.0])))
    np.testing.assert_allclose(inner(Tensor(np.array([3.0]))).asnumpy(), np.cos([3.0]), rtol=1e-15)

    rt.set_context(mode=rt.GRAPH_MODE)

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(p=0.5)

        def construct(self, x):
            return self.drop(x) * 1.0

    net = Net()
    ones = Tensor(np.ones(64, np.float32))
    np.testing.assert_array_equal(net(ones).asnumpy(), np.ones(64))  # evaluation: the identity, a graph
    net.set_train(True)  # the training flags are part of the signature: a new trace, which stops
    with pytest.warns(RuntimeWarning, match="Dropout in training draws a new random mask"):
        a = net(ones).asnumpy()
    with pytest.warns(RuntimeWarning, match=r"^jit\(Dropout\.construct\): not captured"):
        b = net(ones).asnumpy()  # Net runs eagerly now; the Dropout it calls has its own jit, which stops
    assert set(np.unique(a)) <= {0.0, 2.0} and not np.array_equal(a, b)  # a new mask each call
    net.set_train(False)
    np.testing.assert_array_equal(net(ones).asnumpy(), np.ones(64))


def test_graph_mode_sees_a_replaced_parameter(graph_mode):
    class Scale(nn.Cell):
        def __init__(self):
            super().__init__()
            self.w = Parameter(Tensor(np.array([1.0, 2.0])), name="w")

        def construct(self, x):
            return x * self.w

    c = Scale()
    x = Tensor(np.array([1.0, 1.0]))
    np.testing.assert_array_equal(c(x).asnumpy(), [1.0, 2.0])
    c.w = Parameter(Tensor(np.array([10.0, 20.0])), name="w")
    np.testing.assert_array_equal(c(x).asnumpy(), [10.0, 20.0])


def test_the_signature_keys_floats_by_bits_and_arrays_by_contents():
    div = jit(lambda x, s: x / s)
    x = Tensor(np.array([1.0]))
    with np.errstate(divide="ignore"):
        assert div(x, 0.0).asnumpy()[0] == np.inf and div(x, -0.0).asnumpy()[0] == -np.inf
    nan = jit(lambda x, s: x + s)
    for _ in range(3):
        nan(x, float("nan"))
    assert nan.traces == 1
    add = jit(lambda x, a: x + Tensor(a.copy()))
    got = [add(x, np.full(1, float(i))).asnumpy()[0] for i in range(6)]  # freed arrays' ids are reused
    assert got == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0] and add.traces == 6
    add(x, np.full(1, 2.0))
    assert add.traces == 6  # the same contents: the same graph


@pytest.mark.build
def test_a_captured_parameter_that_changes_shape_is_traced_again(tmp_path):
    from runtime import mint
    w = Parameter(Tensor(np.ones(4, np.float32)), name="w")
    f = jit(lambda x: mint.exp(x * w) + 1.0, jit_level="O1")
    x = Tensor(np.zeros(4, np.float32))
    np.testing.assert_array_equal(f(x).asnumpy(), np.full(4, 2.0))
    w.set_data(np.ones(1 << 20, np.float32), slice_shape=True)  # the fused kernel's loops no longer fit
    # what eager says, not a fused kernel writing past its output
    with pytest.raises(ValueError, match=r"op 'mul': the shapes of its inputs \[\[4\], \[1048576\]\] do not "
                                         r"broadcast together"):
        f(x)
    w.set_data(np.full(4, 2.0, np.float32), slice_shape=True)
    np.testing.assert_allclose(f(Tensor(np.ones(4, np.float32))).asnumpy(), np.exp(np.full(4, 2.0)) + 1, rtol=1e-6)


def _reads(what):
    return f"{what} turns its value into a Python value, which a graph would keep as traced"


def _writes(what):
    return f"{what} writes a tensor in place outside an op, which a graph does not hold"


def _set_data(t):
    Parameter(Tensor(np.zeros(())), name="p", requires_grad=False).set_data(t)
    return t * 1.0


def _add_in_place(t):
    y = t * 1.0
    y += 1.0
    return y


def _set_item(t):
    y = t * 1.0
    y[...] = 5.0
    return y


def _dropout(t):
    d = nn.Dropout(p=0.5)
    d.set_train(True)
    return d(t)


@pytest.mark.parametrize("fn, what", [
    (lambda t: t * t.item(), _reads("item() of a tensor")),
    (lambda t: t * t.tolist(), _reads("tolist() of a tensor")),
    (lambda t: t * float(t.asnumpy()), _reads("asnumpy() of a tensor")),
    (lambda t: t * np.asarray(t), _reads("np.asarray (or a numpy function) on a tensor")),
    (lambda t: t * 2.0 if t else t, _reads("bool() of a tensor (an if or while on it)")),
    (lambda t: t * float(t), _reads("float() of a tensor")),
    (lambda t: t * int(t), _reads("int() of a tensor")),
    (lambda t: t * [1.0, 2.0, 3.0][(t * 0).astype(rt.int64)], _reads("a tensor used as an index")),
    (lambda t: t.reshape((1,))[Tensor(np.array([0]))],
     "a tensor used as an index turns its values into the op's attribute, which a graph would keep as traced"),
    (lambda t: ops.assign(t * 1.0, t), _writes("assign")),
    (_add_in_place, _writes("'+='")),
    (_set_item, _writes("Tensor.__setitem__")),
    (_set_data, "Parameter.set_data on p (an in-place write a graph does not hold)"),
    (_dropout, "Dropout in training draws a new random mask on every call, which a graph would keep as traced"),
    (lambda t: rt.grad(lambda u: ops.sum(u * u))(t),
     "grad inside a traced function computes its gradient with the autograd engine, which a graph would keep "
     "as traced"),
    (lambda t: rt.value_and_grad(lambda u: ops.sum(u * u))(t)[1],
     "value_and_grad inside a traced function computes its gradient with the autograd engine, which a graph "
     "would keep as traced"),
], ids=["item", "tolist", "asnumpy", "array", "bool", "float", "int", "index", "tensor index", "assign", "iadd",
        "setitem", "set_data", "dropout", "grad", "value_and_grad"])
def test_each_break_stops_the_trace_with_its_reason(fn, what):
    """Every declared break (runtime/ops/op_entry.py ``breaks_trace``) stops the trace, naming itself and
    the user's line; the call's result is the eager one."""
    x = Tensor(np.array(1.0))
    want = fn(x).asnumpy()
    with pytest.warns(RuntimeWarning) as w:
        got = jit(fn)(x).asnumpy()
    if fn is not _dropout:  # a new mask each call
        np.testing.assert_array_equal(got, want)
    msgs = [str(r.message) for r in w if "not captured" in str(r.message)]
    assert len(msgs) == 1 and f", {what}; this signature runs eagerly" in msgs[0], msgs
    assert f"at {HERE}:" in msgs[0], msgs[0]


def test_a_grad_mode_change_inside_a_traced_function_runs_it_eagerly():
    """A graph has one grad mode: jit recorded the ops of a no_grad block with the others, and the
    gradient went through them ([5, 7] where eager and torch give [2, 4]), unseen. The trace stops there
    and the call goes on eagerly, with the warning naming why."""
    def f(x):
        with rt.no_grad():
            y = x * 3
        return (y + x * x).sum()

    def g(x):
        with rt.enable_grad():
            return x * x

    x = Tensor(np.array([1.0, 2.0]))
    want = rt.grad(f)(x).asnumpy()
    np.testing.assert_array_equal(want, [2.0, 4.0])
    j = rt.jit(f)
    with pytest.warns(RuntimeWarning, match=r"a change of grad mode \(no_grad, enable_grad, set_grad_enabled\) "
                                            r"inside a traced function"):
        got = rt.grad(j)(x).asnumpy()
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(rt.grad(j)(x).asnumpy(), want)  # and on later calls
    xg = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    jg = rt.jit(g)
    with rt.no_grad(), pytest.warns(RuntimeWarning, match="a change of grad mode"):
        assert jg(xg).requires_grad  # as torch's enable_grad inside no_grad
