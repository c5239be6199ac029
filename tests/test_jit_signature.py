"""The cache key of a jitted call keys every plain value by its type and exact value, inside every container:
a value equal by == to a traced one but of another type, another zero sign or another NaN payload gets its own
trace, so results match the same calls without jit, bit for bit; equal values reuse the graph."""
from __future__ import annotations

import collections
import math
import struct

import numpy as np
import pytest

from runtime import Tensor, jit

Cfg = collections.namedtuple("Cfg", "k")


def nan_with(payload):
    return struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000000 | payload))[0]


# how a scalar goes into an argument; leaf() takes it out again
CONTAINERS = {
    "bare": lambda v: v,
    "namedtuple": lambda v: Cfg(v),
    "tuple": lambda v: (v,),
    "list": lambda v: [v],
    "frozenset": lambda v: frozenset({v}),
    "set": lambda v: {v},
    "dict_key": lambda v: {v: "a"},
    "dict_value": lambda v: {"a": v},
    "nested": lambda v: [{"a": (Cfg(frozenset({(1, v)})),)}],
}


def leaf(c):
    """The one scalar inside ``c`` (the last leaf of a tuple)."""
    while True:
        if isinstance(c, dict):
            k, v = next(iter(c.items()))
            c = k if v == "a" else v
        elif isinstance(c, (tuple, list)):
            c = c[-1]
        elif isinstance(c, (set, frozenset)):
            c = next(iter(c))
        else:
            return c


# pairs of scalars equal by == that a trace must tell apart, with an op showing the difference
FAMILIES = {
    "int_float": ([2, 2.0], lambda x, s: x * s, np.array([3, 4], np.int32)),  # Int32 vs Float32
    "zero_sign": ([0.0, -0.0], lambda x, s: x / s, np.array([1.0, -2.0])),  # inf vs -inf
    "np_float32_zero_sign": ([np.float32(0.0), np.float32(-0.0)], lambda x, s: x / s,
                             np.array([1.0, -2.0], np.float32)),
    "np_float16_zero_sign": ([np.float16(0.0), np.float16(-0.0)], lambda x, s: x / s,
                             np.array([1.0, -2.0], np.float16)),
    "nan_payload": ([nan_with(1), nan_with(2)], lambda x, s: x + s, np.array([0.0, 1.0])),
    "complex_zero_sign": ([complex(1.0, 0.0), complex(1.0, -0.0)], lambda x, s: x * math.copysign(1.0, s.imag),
                          np.array([1.0, -2.0])),
    "np_float64_nan_payload": ([np.float64(nan_with(1)), np.float64(nan_with(2))], lambda x, s: x + s,
                               np.array([0.0, 1.0])),
}


def bits(t):
    a = t.asnumpy()
    return a.view(np.dtype(f"u{a.dtype.itemsize}")).tolist(), a.dtype.str


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("container", list(CONTAINERS))
def test_values_equal_by_eq_but_not_exactly_are_traced_apart_in_every_container(container, family):
    scalars, op, data = FAMILIES[family]
    wrap = CONTAINERS[container]

    def fn(x, c):
        return op(x, leaf(c))

    j = jit(fn)
    x = Tensor(data)
    for s in scalars * 2:  # each once, then each again in a new container object: the graph is reused
        with np.errstate(divide="ignore", invalid="ignore"):
            assert bits(j(x, wrap(s))) == bits(fn(x, wrap(s))), (container, s)
    assert j.traces == 2


def test_a_set_changed_in_place_between_calls_is_a_new_signature():
    f = jit(lambda x, s: x * max(s))
    x, s = Tensor(np.array([1.0, 2.0])), {2.0}
    np.testing.assert_array_equal(f(x, s).asnumpy(), [2.0, 4.0])
    s.add(3.0)
    np.testing.assert_array_equal(f(x, s).asnumpy(), [3.0, 6.0])
    s.discard(3.0)
    np.testing.assert_array_equal(f(x, s).asnumpy(), [2.0, 4.0])
    assert f.traces == 2


def test_a_namedtuple_of_tensors_passes_them_as_inputs():
    f = jit(lambda cfg: cfg.k * 2.0)
    a, b = Tensor(np.array([1.0])), Tensor(np.array([5.0]))
    np.testing.assert_array_equal(f(Cfg(a)).asnumpy(), [2.0])
    np.testing.assert_array_equal(f(Cfg(b)).asnumpy(), [10.0])
    assert f.traces == 1


def test_unhashable_unknown_values_are_still_keyed_by_identity():
    class Opaque:
        __hash__ = None

        def __init__(self, k):
            self.k = k

        def __eq__(self, other):
            return True  # never consulted: identity decides

    f = jit(lambda x, o: x * o.k)
    x, one, two = Tensor(np.array([1.0])), Opaque(1.0), Opaque(2.0)
    assert f(x, one).asnumpy()[0] == 1.0 and f(x, two).asnumpy()[0] == 2.0 and f(x, one).asnumpy()[0] == 1.0
    assert f.traces == 2


def test_namedtuple_and_dict_results_carry_each_calls_values_and_gradients():
    from collections import OrderedDict

    import runtime as rt
    from runtime import mint
    from runtime.autograd.gradcheck import gradcheck

    Pair = collections.namedtuple("Pair", "a b")

    def fn(x):
        return {"pair": Pair(x * 2.0, mint.sin(x)), "od": OrderedDict(c=x * x), "k": 3}

    j = jit(fn)
    for v in ([1.0, 2.0], [5.0, -1.0]):  # the call that traces, then a cached one with other values
        x = Tensor(np.array(v))
        got, want = j(x), fn(x)
        assert type(got["pair"]) is Pair and type(got["od"]) is OrderedDict and got["k"] == 3
        for a, b in ((got["pair"].a, want["pair"].a), (got["pair"].b, want["pair"].b),
                     (got["od"]["c"], want["od"]["c"])):
            np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())
    assert j.traces == 1
    x = Tensor(np.array([0.3, -0.7]))
    loss = lambda f: lambda t: mint.sum(f(t)["pair"].b * f(t)["od"]["c"])  # noqa: E731
    np.testing.assert_allclose(rt.grad(loss(j))(x).asnumpy(), rt.grad(loss(fn))(x).asnumpy(), rtol=1e-12)
    gradcheck(lambda t: (j(t)["pair"].b, j(t)["od"]["c"]), [x])
