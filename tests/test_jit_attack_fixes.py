"""runtime.jit and GRAPH_MODE give eager's answer where an attack found them silently wrong (issue 33).

1. The version of every tensor a jitted call's backward reads (an input, a captured Parameter, a value the
   forward wrote after reading) is checked at backward, with eager's error, on the tracing call and on
   replays; a read that is still current gives eager's gradient.
2. An output over an input's memory (the input, a slice, reshape or transpose of it) is a view of that input
   sharing its version counter, so a write through it is seen by the checks of nodes that saved the input.
3. The guards see a __slots__ field, a types.SimpleNamespace field, an attribute of a module made at run
   time, a functools.partial's keywords and a helper's defaults.
"""
from __future__ import annotations

import functools
import types
import warnings

import numpy as np
import pytest

import runtime as rt
from runtime import Parameter, Tensor, jit, nn
from runtime.autograd import Function, grad

from op_util import CPP, load_op

STALE = "modified by an in-place operation"


@pytest.fixture(scope="module")
def counted(cache_dir):
    """tests/cpp/jit_counted_ops.cpp: scale_(x, k) writes x *= k in place (MarkDirty) and returns x."""
    return load_op("jit_counted_ops", [CPP / "jit_counted_ops.cpp"], cflags=["-Wall", "-Wextra", "-Werror"])


class Halve(Function):
    """x *= 0.5 in place (mark_dirty); it writes a view's memory, which is its base's."""

    @staticmethod
    def forward(ctx, x):
        x._data *= 0.5
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 0.5


def outcome(run):
    """('raised', message) or ('grad', values) of ``run()`` (a gradient as a numpy array)."""
    try:
        g = run()
    except RuntimeError as e:
        return ("raised", str(e))
    return ("grad", np.asarray(g.asnumpy()).tolist())


# ---- 1. saved tensors of built-in ops are version-checked --------------------------------------------------

@pytest.mark.parametrize("level", ["O0", "O1"])
def test_an_input_written_after_the_call_fails_its_backward_as_eagerly(counted, level):
    f = jit(lambda a: a * a, jit_level=level)

    def run(fn):
        x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
        a = x * 1.0
        y = fn(a)
        counted.scale_(a, 3.0)
        return outcome(lambda: grad(y.sum(), x)[0])

    want = run(lambda a: a * a)
    assert want[0] == "raised" and STALE in want[1]
    for _ in range(3):  # the tracing call and replays
        assert run(f) == want


def test_a_saved_input_that_needs_no_grad_is_checked(counted):
    f = jit(lambda a, c: a * c)

    def run(fn):
        x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
        c = Tensor(np.array([3.0, 4.0]))
        y = fn(x, c)
        counted.scale_(c, 3.0)
        return outcome(lambda: grad(y.sum(), x)[0])

    want = run(lambda a, c: a * c)
    assert want[0] == "raised"
    for _ in range(3):
        assert run(f) == want
    with pytest.raises(RuntimeError, match=r"argument 1 of mul is at version 1; expected version 0"):
        x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
        c = Tensor(np.array([3.0, 4.0]))
        y = f(x, c)
        counted.scale_(c, 3.0)
        grad(y.sum(), x)


def test_a_captured_parameter_written_under_no_grad_is_checked(counted):
    def run(mk):
        w = Parameter(Tensor(np.array([1.0, 2.0])), requires_grad=False)
        fn = mk(lambda a: a * w)
        res = []
        for _ in range(3):
            x = Tensor(np.array([1.0, 1.0]), requires_grad=True)
            y = fn(x * 1.0)
            with rt.no_grad():
                counted.scale_(w, 3.0)
            res.append(outcome(lambda: grad(y.sum(), x)[0]))
        return res

    want = run(lambda f: f)
    assert all(r[0] == "raised" and STALE in r[1] for r in want)
    assert run(jit) == want


def test_a_value_the_forward_writes_after_reading_it_fails_on_every_call(counted):
    def fg(a, b):
        y = b * b  # saves b
        counted.scale_(a, 3.0)  # writes a, which is b
        return y

    def run(fn):
        x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
        a = x * 1.0
        y = fn(a, a)
        return outcome(lambda: grad(y.sum(), x)[0])

    want = run(fg)
    assert want[0] == "raised" and STALE in want[1]
    j = jit(fg)
    for _ in range(3):
        assert run(j) == want


def test_graph_mode_a_value_written_after_a_read_fails_on_every_call(counted, graph_mode):
    class Net(nn.Cell):
        def construct(self, x):
            h = x * 1.0
            y = h * h
            counted.scale_(h, 3.0)
            return y.sum()

    step = rt.grad(Net())
    for _ in range(3):
        with pytest.raises(RuntimeError, match=r"modified by an in-place operation: argument 0 of mul is at "
                                               r"version 1; expected version 0"):
            step(Tensor(np.array([1.0, 2.0])))


@pytest.mark.parametrize("use", ["add", "mul"])
def test_an_op_output_the_forward_writes_after_its_rule_read_it_fails_on_every_call(use):
    """exp's rule reads its output (add: nothing else); h * h's rules read h: each fails, named as eagerly."""
    def f(a):
        h = rt.mint.exp(a)
        y = h + 1.0 if use == "add" else h * h
        Halve.apply(h)
        return y

    def run(fn):
        x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
        y = fn(x * 1.0)
        return outcome(lambda: grad(y.sum(), x)[0])

    want = run(f)
    assert want[0] == "raised" and (("output 0 of exp" if use == "add" else "argument 0 of mul") in want[1])
    j = jit(f)
    for _ in range(3):
        assert run(j) == want


def test_reads_still_current_give_eagers_gradient(counted):
    def fg(a, c):
        counted.scale_(c, 2.0)  # written before it is read: the read is current
        return a * c * a

    def run(fn):
        x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
        c = Tensor(np.array([3.0, 4.0]))
        y = fn(x * 1.0, c)
        return outcome(lambda: grad(y.sum(), x)[0])

    want = run(fg)
    assert want == ("grad", [12.0, 32.0])
    j = jit(fg)
    for _ in range(3):
        assert run(j) == want


# ---- 2. outputs over an input's memory are views of it ------------------------------------------------------

VIEWS = {
    "slice": lambda a: a[1:],
    "reshape": lambda a: a.reshape(2, 3),
    "transpose": lambda a: a.reshape(2, 3).T,
    "identity": lambda a: a,
}


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_a_write_through_an_output_viewing_the_input_is_seen(name):
    fn = VIEWS[name]

    def run(f):
        x = Tensor(np.arange(1.0, 7.0), requires_grad=True)
        a = x * 1.0
        p = f(a)
        y = a * a  # saves a
        Halve.apply(p)  # writes a's memory through p
        assert p._version == a._version == 1
        return a.asnumpy().tolist(), outcome(lambda: grad(y.sum(), x)[0])

    want = run(fn)
    assert want[1][0] == "raised" and STALE in want[1][1]
    j = jit(fn)
    for _ in range(3):
        assert run(j) == want


@pytest.mark.parametrize("requires_grad", [True, False])
def test_an_output_viewing_the_input_has_it_as_base(requires_grad):
    j = jit(lambda a: a[1:])
    for _ in range(3):
        a = Tensor(np.arange(4.0), requires_grad=requires_grad) * 1.0 if requires_grad else Tensor(np.arange(4.0))
        p = j(a)
        assert p._base is a and p._vc is a._vc


def test_the_gradient_through_a_write_into_an_output_view_is_eagers():
    def run(f):
        x = Tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
        a = x * 1.0
        Halve.apply(f(a))
        return outcome(lambda: grad((a * a).sum(), x)[0])

    want = run(lambda a: a[1:])
    assert want == ("grad", [2.0, 1.0, 1.5])  # d(a*a)/dx with a = [x0, x1/2, x2/2]
    j = jit(lambda a: a[1:])
    for _ in range(3):
        assert run(j) == want


def test_graph_mode_a_cell_returning_a_slice_of_its_input(graph_mode):
    class V(nn.Cell):
        def construct(self, a):
            return a[1:]

    v = V()
    for _ in range(3):
        x = Tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
        a = x * 1.0
        p = v(a)
        y = a * a
        Halve.apply(p)
        with pytest.raises(RuntimeError, match=r"modified by an in-place operation: argument 0 of mul is at "
                                               r"version 1; expected version 0"):
            grad(y.sum(), x)


# ---- 3. guards -------------------------------------------------------------------------------------------

class _Slots:
    __slots__ = ("k",)

    def __init__(self) -> None:
        self.k = 2.0


_SL = _Slots()
_NS = types.SimpleNamespace(k=2.0)
_MOD = types.ModuleType("h13_cfg_dyn")
_MOD.k = 2.0
_PART = functools.partial(lambda t, k: t * k, k=2.0)


def _dflt(t, k=2.0):
    return t * k


def _kwdflt(t, *, k=2.0):
    return t * k


GUARDED = {
    "slots": (lambda t: t * _SL.k, lambda v: setattr(_SL, "k", v)),
    "namespace": (lambda t: t * _NS.k, lambda v: setattr(_NS, "k", v)),
    "module": (lambda t: t * _MOD.k, lambda v: setattr(_MOD, "k", v)),
    "partial_keywords": (lambda t: _PART(t), lambda v: _PART.keywords.__setitem__("k", v)),
    "defaults": (lambda t: _dflt(t), lambda v: setattr(_dflt, "__defaults__", (v,))),
    "kwdefaults": (lambda t: _kwdflt(t), lambda v: setattr(_kwdflt, "__kwdefaults__", {"k": v})),
}


@pytest.mark.parametrize("name", sorted(GUARDED))
def test_a_changed_read_is_seen(name):
    fn, change = GUARDED[name]
    j = jit(fn)
    try:
        x = Tensor(np.array([1.0, 2.0]))
        np.testing.assert_array_equal(j(x).asnumpy(), [2.0, 4.0])
        change(5.0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = j(x).asnumpy()
        np.testing.assert_array_equal(got, fn(x).asnumpy())
        np.testing.assert_array_equal(got, [5.0, 10.0])
        assert j.traces == 2
        np.testing.assert_array_equal(j(x).asnumpy(), [5.0, 10.0])
        assert j.traces == 2  # the new value's trace is reused
    finally:
        change(2.0)


@pytest.mark.parametrize("kind", ["namespace", "slots"])
def test_graph_mode_a_field_of_a_cell_attribute_is_seen(kind, graph_mode):
    class Net(nn.Cell):
        def __init__(self, cfg):
            super().__init__()
            self.cfg = cfg

        def construct(self, x):
            return x * self.cfg.k

    cfg = types.SimpleNamespace(k=2.0) if kind == "namespace" else _Slots()
    n = Net(cfg)
    x = Tensor(np.array([1.0, 2.0]))
    np.testing.assert_array_equal(n(x).asnumpy(), [2.0, 4.0])
    cfg.k = 5.0
    np.testing.assert_array_equal(n(x).asnumpy(), [5.0, 10.0])
