"""runtime.jit gives each result the history, version counter and write rules eager gives it, on the trace
call and on every replay (an attack on 8d746cf; each case was wrong at its parent too):

- an argument a C++ function hands back twice (x_twice) on a leaf: both results reach the leaf;
- one value returned at two positions (``return y, y``): one version counter;
- an argument a C++ function hands back as it came (just_x): the argument's counter and write rules;
- a result computed only from an opaque op's results without history (a view of an argument needing no
  gradient, zeros a value picked, a non-differentiable output): no history, as eagerly."""
from __future__ import annotations

import numpy as np
import pytest

import runtime as rt
from runtime import Tensor

from op_util import CPP, load_op

pytestmark = pytest.mark.build

X = np.array([1.0, 2.0, 3.0, 4.0])
CALLS = ("eager", "trace", "replay", "replay")


@pytest.fixture(scope="session")
def parity_ops(cache_dir):
    return load_op("parity_ops", [CPP / "parity_ops.cpp"])


def _each_call(fn):
    """fn itself, then its jitted form three times (the trace, two replays)."""
    jitted = rt.jit(fn)
    return [(what, fn if what == "eager" else jitted) for what in CALLS]


def test_an_argument_handed_back_twice_reaches_the_leaf_from_both(parity_ops):
    def f(x):
        a, b = parity_ops.x_twice(x)
        return a * 2.0, b * 2.0
    for what, g in _each_call(f):
        x = Tensor(X.copy(), requires_grad=True)
        a, b = g(x)
        assert a.requires_grad and b.requires_grad, what
        (a.sum() + b.sum()).backward()
        np.testing.assert_array_equal(x.grad.asnumpy(), np.full(4, 4.0), err_msg=what)


def test_one_value_at_two_positions_counts_writes_on_one_counter():
    def f(x):
        y = x * 2.0
        return y, y
    for what, g in _each_call(f):
        x = Tensor(X.copy(), requires_grad=True)
        w = Tensor(np.ones(4), requires_grad=True)
        a, b = g(x)
        c = a * w  # saves a for w's gradient
        with rt.no_grad():
            b *= 10.0
        assert a._version == b._version == 1, what
        with pytest.raises(RuntimeError, match=r"^one of the tensors needed for gradient computation has been "
                                               r"modified by an in-place operation"):
            c.sum().backward()


def test_an_argument_handed_back_as_it_came_keeps_its_counter_and_write_rules(parity_ops):
    for what, g in _each_call(lambda x: parity_ops.just_x(x)):
        x = Tensor(X.copy(), requires_grad=True)
        w = Tensor(np.ones(4), requires_grad=True)
        z = x * w  # saves x for w's gradient
        o = g(x)
        with rt.no_grad():
            parity_ops.scale_(o)
        assert x._version == 1, what
        with pytest.raises(RuntimeError, match=r"^one of the tensors needed for gradient computation has been "
                                               r"modified by an in-place operation"):
            z.sum().backward()
    for what, g in _each_call(lambda x: parity_ops.just_x(x)):
        x = Tensor(X.copy(), requires_grad=True)
        # (a replay's result is a new tensor over the leaf's memory: a view of it, refused as such)
        with pytest.raises(RuntimeError, match=r"^ParityScale modifies argument 0 in place \(MarkDirty\), but it "
                                               r"is a (view of a )?leaf that requires grad"):
            parity_ops.scale_(g(x))
        np.testing.assert_array_equal(x.asnumpy(), X, err_msg=what)


class _SignOut(rt.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = Tensor(np.sign(x.asnumpy()))
        ctx.mark_non_differentiable(out)
        return out

    @staticmethod
    def backward(ctx, g):
        return g * 0.0


@pytest.mark.parametrize("case", ["view of another argument", "zeros a value picked", "non-differentiable",
                                  "an opaque op of it", "an opaque op saving it"])
def test_a_result_of_results_without_history_has_none(parity_ops, case):
    fn, args = {
        "view of another argument": (lambda x, y: parity_ops.second_mid(x, y) * 2.0,
                                     lambda: (Tensor(X.copy(), requires_grad=True), Tensor(X + 1.0))),
        "zeros a value picked": (lambda x: parity_ops.square_if_positive(x).sum(),
                                 lambda: (Tensor(-X, requires_grad=True),)),
        "non-differentiable": (lambda x: _SignOut.apply(x) + 1.0, lambda: (Tensor(X.copy(), requires_grad=True),)),
        # (the opaque op after it records a node over the stand-in history its argument gets: a review of 463eb7a)
        "an opaque op of it": (lambda x, y: parity_ops.mul(parity_ops.second_mid(x, y), y[:2]),
                               lambda: (Tensor(X.copy(), requires_grad=True), Tensor(X + 1.0))),
        "an opaque op saving it": (lambda x, y: parity_ops.exp_saved(parity_ops.second_mid(x, y)),
                                   lambda: (Tensor(X.copy(), requires_grad=True), Tensor(X + 1.0))),
    }[case]
    for what, g in _each_call(fn):
        a = args()
        r = g(*a)
        assert not r.requires_grad and r._node is None, what
        with pytest.raises(RuntimeError, match=r"^autograd\.grad: output 0 does not require grad and has no "
                                               r"history"):
            rt.autograd.grad([r.sum()], [a[0]], allow_unused=True)
