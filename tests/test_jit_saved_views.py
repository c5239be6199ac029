"""A jitted call's backward reads a view of an input or of a captured tensor (a Parameter) that the caller then
writes in place, under no_grad, before the backward: eagerly the node that saved the view sees the write (a
view counts writes on its base's version counter) and the backward fails. Under jit it fails too, on the call
that traces and on later calls, with eager's error (type and message), on every backend path; without the
write the gradients are eager's and central differences'. A view of a captured tensor handed out by the call
shares that tensor's version counter, as eagerly."""
from __future__ import annotations

import numpy as np
import pytest

import runtime as rt
from inplace_util import PySquare, central
from runtime import Parameter, Tensor, jit, mint, nn
from runtime.graph import list_backends, register_backend

P0 = np.array([0.5, -1.0, 2.0, 3.0])
X = np.array([1.5, -0.5, 2.5])
CALLS = 3  # the call that traces, then two replays
COPYING = "test_saved_views_copying"  # a backend whose values are new memory: no view of an input


def _copying(graph, config):
    def run(inputs):
        return [Tensor._from_array(o._data.copy()) for o in graph.run(inputs)]
    return run


if COPYING not in list_backends():
    register_backend(COPYING, _copying)

# ms_backend at O0 and O1 (which builds fused kernels), and a backend giving copies of the saved views
CONFIGS = {"O0": {}, "O1": {"jit_level": "O1"}, "copying": {"backend": COPYING}}
LEVELS = ["O0", pytest.param("O1", marks=pytest.mark.build), "copying"]
ROUTES = ["jit", pytest.param("jit_O1", marks=pytest.mark.build), "jit_copying", "graph_mode"]


def _error(backward):
    with pytest.raises(RuntimeError) as e:
        backward()
    return str(e.value)


def square_of_view(x):
    v = x[1:]
    return (v * v).sum()


def reshaped_view(x):
    v = x.reshape(2, 2)[1:]
    return mint.sin(v).sum()


INPUT_FORMS = {"slice": (square_of_view, lambda x: np.sum(x[1:] ** 2)),
               "reshape_then_slice": (reshaped_view, lambda x: np.sum(np.sin(x.reshape(2, 2)[1:])))}


def _input_call(f):
    """Call ``f`` on a fresh input, add 1 to the input in place under no_grad, then backward: the error."""
    x = Tensor(P0.copy(), requires_grad=True)
    loss = f(x)
    with rt.no_grad():
        x += 1.0
    return _error(loss.backward)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("form", sorted(INPUT_FORMS))
def test_a_write_to_an_input_whose_view_the_backward_reads_fails_as_eagerly(form, level):
    fn, _ = INPUT_FORMS[form]
    want = _input_call(fn)
    assert "modified by an in-place operation" in want
    j = jit(fn, **CONFIGS[level])
    for call in range(CALLS):
        assert _input_call(j) == want, f"call {call}"
    assert j.traces == 1


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("form", sorted(INPUT_FORMS))
def test_without_the_write_the_gradient_of_an_inputs_view_is_eagers(form, level):
    fn, ref = INPUT_FORMS[form]
    x = Tensor(P0.copy(), requires_grad=True)
    fn(x).backward()
    want = x.grad.asnumpy()
    np.testing.assert_allclose(want, central(ref, P0), rtol=1e-7, atol=1e-9)
    j = jit(fn, **CONFIGS[level])
    for call in range(CALLS):
        x = Tensor(P0.copy(), requires_grad=True)
        j(x).backward()
        np.testing.assert_allclose(x.grad.asnumpy(), want, rtol=1e-13, err_msg=f"call {call}")


def test_a_view_of_an_input_that_needs_no_gradient_read_for_anothers_fails_as_eagerly():
    def f(x, w):
        return (x[1:] * w).sum()

    def call(fn):
        x, w = Tensor(P0.copy()), Tensor(X.copy(), requires_grad=True)
        loss = fn(x, w)
        with rt.no_grad():
            x += 1.0
        return _error(loss.backward)

    want = call(f)
    j = jit(f)
    for k in range(CALLS):
        assert call(j) == want, f"call {k}"


class ViewNet(nn.Cell):
    """Reads a view of its Parameter twice: (v * x * v).sum(), v = p[1:]."""

    def __init__(self):
        super().__init__()
        self.p = Parameter(Tensor(P0.copy()), name="p")

    def construct(self, x):
        v = self.p[1:]
        return (v * x * v).sum()


class ViewOutNet(nn.Cell):
    """Hands out the view of its Parameter it reads: (v * v * x, v), v = p[1:] (v * x alone would not save v,
    whose gradient reads only x, as torch's mul)."""

    def __init__(self):
        super().__init__()
        self.p = Parameter(Tensor(P0.copy()), name="p")

    def construct(self, x):
        v = self.p[1:]
        return v * v * x, v


def _param_call(net, fn, returns_view, copies=False):
    """One step: call, add 1 to ``net.p`` in place under no_grad, backward through the first output."""
    out = fn(Tensor(X.copy()))
    if returns_view:
        y, v = out
        with rt.no_grad():
            net.p += 1.0
        if not copies:  # the view handed out counts the Parameter's writes (a copy is memory of its own)
            assert v._version == net.p._version
        return _error(lambda: y.sum().backward())
    with rt.no_grad():
        net.p += 1.0
    return _error(out.backward)


def _jitted(net, route, request):
    if route == "graph_mode":
        request.getfixturevalue("graph_mode")
        return net
    return jit(net.construct, **CONFIGS[route[4:] if route != "jit" else "O0"])


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("cls", [ViewNet, ViewOutNet])
def test_a_write_to_a_parameter_whose_view_the_backward_reads_fails_as_eagerly(cls, route, request):
    eager_net = cls()
    want = [_param_call(eager_net, eager_net, cls is ViewOutNet) for _ in range(CALLS)]
    assert all("modified by an in-place operation" in w for w in want)
    net = cls()
    fn = _jitted(net, route, request)
    for call in range(CALLS):
        assert _param_call(net, fn, cls is ViewOutNet, route == "jit_copying") == want[call], f"call {call}"


@pytest.mark.parametrize("route", ["jit", pytest.param("jit_O1", marks=pytest.mark.build), "graph_mode"])
def test_a_write_through_the_handed_out_view_of_a_parameter_fails_as_eagerly(route, request):
    def step(net, fn):
        y, v = fn(Tensor(X.copy()))
        with rt.no_grad():
            v += 1.0
        assert net.p._version == v._version  # the Parameter sees the write, as eagerly
        return _error(lambda: y.sum().backward())

    eager_net = ViewOutNet()
    want = [step(eager_net, eager_net) for _ in range(CALLS)]
    net = ViewOutNet()
    fn = _jitted(net, route, request)
    for call in range(CALLS):
        assert step(net, fn) == want[call], f"call {call}"


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("cls", [ViewNet, ViewOutNet])
def test_without_the_write_the_gradient_of_a_parameters_view_is_eagers(cls, route, request):
    def ref(p):
        v = p[1:]
        return np.sum(v * X * v) if cls is ViewNet else np.sum(v * v * X)

    def loss_of(out):
        return out if cls is ViewNet else out[0].sum()

    eager_net = cls()
    loss_of(eager_net(Tensor(X.copy()))).backward()
    want = eager_net.p.grad.asnumpy()
    np.testing.assert_allclose(want, central(ref, P0), rtol=1e-7, atol=1e-9)
    net = cls()
    fn = _jitted(net, route, request)
    for call in range(CALLS):
        net.p.grad = None
        loss_of(fn(Tensor(X.copy()))).backward()
        np.testing.assert_allclose(net.p.grad.asnumpy(), want, rtol=1e-13, err_msg=f"call {call}")


def test_a_view_of_a_parameter_handed_out_without_grad_shares_its_version_counter():
    net = ViewOutNet()
    j = jit(net.construct)
    for call in range(CALLS):
        with rt.no_grad():
            _, v = j(Tensor(X.copy()))
            net.p += 1.0
        assert v._version == net.p._version, f"call {call}"
        np.testing.assert_array_equal(v.asnumpy(), net.p.asnumpy()[1:])


class OpaqueViewNet(nn.Cell):
    """A Python Function saving a view of the Parameter."""

    def __init__(self):
        super().__init__()
        self.p = Parameter(Tensor(P0.copy()), name="p")

    def construct(self, x):
        return (PySquare.apply(self.p[1:]) * x).sum()


def test_an_opaque_op_saving_a_view_of_a_parameter_fails_as_eagerly():
    eager_net = OpaqueViewNet()
    want = [_param_call(eager_net, eager_net, False) for _ in range(CALLS)]
    net = OpaqueViewNet()
    j = jit(net.construct)
    for call in range(CALLS):
        assert _param_call(net, j, False) == want[call], f"call {call}"


def test_a_reshape_that_copies_for_other_strides_is_checked_as_eagerly():
    """x.reshape(-1) views a contiguous x and copies a transposed one (same shape, one signature): eagerly only
    the view sees the write to x. Whichever strides the trace saw, each call fails as eagerly or gives eager's
    gradient."""
    a = np.array([[1.0, -2.0, 0.5], [3.0, 1.5, -1.0]])
    make = {"contiguous": lambda: Tensor(a.copy(), requires_grad=True),
            "transposed": lambda: rt.from_numpy(np.ascontiguousarray(a.T).T).requires_grad_()}

    def f(x):
        v = x.reshape(-1)
        return (v * v).sum()

    def call(fn, name):
        x = make[name]()
        loss = fn(x)
        with rt.no_grad():
            x += 1.0
        try:
            loss.backward()
        except RuntimeError as e:
            return str(e)
        return x.grad.asnumpy()

    for first, other in (("contiguous", "transposed"), ("transposed", "contiguous")):
        j = jit(f)
        for name in (first, other, first, other):
            want, got = call(f, name), call(j, name)
            if isinstance(want, str):
                assert "modified by an in-place operation" in want
                assert isinstance(got, str) and got == want, f"traced {first}, called {name}: {got}"
            else:
                assert not isinstance(got, str), f"traced {first}, called {name}: {got}"
                np.testing.assert_array_equal(got, want, err_msg=f"traced {first}, called {name}")
        assert j.traces == 1
