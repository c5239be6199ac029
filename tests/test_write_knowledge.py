"""Arguments a write would be refused for are kept only where a write can happen (issue 33 #14, and its
"no per-call cost regression").

Before Forward, every argument a write would be refused for (a leaf that requires grad, a view of one, an
expanded tensor) is kept so that a refusal can put it back. Each operator type (a C++ ``Function<T>``, a
Python ``Function`` subclass) learns from its calls whether it writes its arguments: its arguments are kept
until a recorded call of it completed without writing, and on every call once one of its calls wrote
(runtime/call_rules.py, include/opbuilder/detail/call_rules.h WriteKnowledge). A parameter of an op that
only reads it is therefore not copied per call. What a kept argument shows is observable: a write that
Forward makes without MarkDirty is put back; one made while nothing is kept is found (by the fingerprint)
but stays. Each C++ test uses its own ``WriteIf<Tag>`` type, each Python test its own class: what a type
learned is per type.
"""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import runtime as rt
from op_util import CPP, load_op
from runtime import Tensor
from runtime.autograd import Function
from runtime.tensor import Parameter

pytestmark = pytest.mark.build  # the module's fixture compiles tests/cpp/write_knowledge_ops.cpp

UNMARKED = r"modified argument 0 in place without (MarkDirty|mark_dirty)"
LEAF = (r"modifies argument 0 in place \((MarkDirty|mark_dirty)\), but it is a leaf that requires grad; in-place "
        r"changes of such leaves are not allowed")


@pytest.fixture(scope="module")
def ops(cache_dir):
    return load_op("write_knowledge_ops", [CPP / "write_knowledge_ops.cpp"], cflags=["-Wall", "-Wextra", "-Werror"],
                   binding="nanobind")


def py_write_if():
    """A new Python Function class (a type that has learned nothing) doing what WriteIf<Tag> does."""

    class PyWriteIf(Function):
        @staticmethod
        def forward(ctx, x, write, mark):
            a = x.asnumpy()
            if write:
                a[0] += 1.0
            if write and mark:
                ctx.mark_dirty(x)
                return x
            return a * 2.0

        @staticmethod
        def backward(ctx, g):
            return g, None, None

    return PyWriteIf.apply


def routes(ops):
    return {"cpp": [ops.write_if_0, ops.write_if_1, ops.write_if_2], "python": [py_write_if() for _ in range(3)]}


@pytest.mark.parametrize("route", ["cpp", "python"])
def test_an_op_that_wrote_nothing_keeps_no_copy_of_a_parameter_until_it_writes(ops, route):
    op = routes(ops)[route][0]
    w = Parameter(np.array([1.0, 2.0, 3.0]))  # small: the fingerprint reads every byte
    for _ in range(3):  # recorded calls that write nothing: after the first, nothing is kept
        op(w, False, False)
    v = w._version
    with pytest.raises(RuntimeError, match=UNMARKED):
        op(w, True, False)  # nothing was kept: the fingerprint finds the write, which stays
    assert w.tolist() == [2.0, 2.0, 3.0] and w._version == v + 1
    with pytest.raises(RuntimeError, match=UNMARKED):
        op(w, True, False)  # the type wrote: from now on its refused arguments are kept, and put back
    assert w.tolist() == [2.0, 2.0, 3.0]


@pytest.mark.parametrize("route", ["cpp", "python"])
def test_an_op_that_marks_dirty_only_on_some_calls_is_protected_from_its_first_write_on(ops, route):
    op = routes(ops)[route][1]
    x = Tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    op(x, False, False)  # a recorded call that writes nothing
    v = x._version
    with pytest.raises(RuntimeError, match=LEAF):
        op(x, True, True)  # the same refusal, decided after the write (the documented hole)
    assert x.tolist() == [2.0, 2.0, 3.0] and x._version == v + 1
    for _ in range(2):
        with pytest.raises(RuntimeError, match=LEAF):
            op(x, True, True)  # decided before Forward: the data untouched
        assert x.tolist() == [2.0, 2.0, 3.0] and x._version == v + 1


@pytest.mark.parametrize("route", ["cpp", "python"])
def test_an_op_known_to_write_leaves_a_refused_argument_untouched_on_every_later_call(ops, route):
    op = routes(ops)[route][2]
    a = Tensor(np.array([1.0, 2.0]), requires_grad=True) * 1.0  # a non-leaf: the write is allowed
    op(a, True, True)
    op(a, False, False)  # a call without a write does not make the type a reader
    with rt.no_grad():
        op(Tensor(np.array([5.0])), True, True)
    x = Tensor(np.arange(10000.0), requires_grad=True)  # beyond the sampled fingerprint's full size
    for _ in range(2):
        with pytest.raises(RuntimeError, match=LEAF):
            op(x, True, True)
        np.testing.assert_array_equal(x.asnumpy(), np.arange(10000.0))


def _peak_bytes(call) -> int:
    """The most memory (numpy's included) Python had allocated at once during ``call()``, over before."""
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    call()
    return tracemalloc.get_traced_memory()[1] - before


def test_a_python_function_that_writes_nothing_copies_no_parameter_after_its_first_call():
    class Dot(Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return np.asarray(np.dot(x.asnumpy(), w.asnumpy()))  # a 0-d result: the call itself allocates ~nothing

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            return g * w, g * x

    n = 1 << 20
    w = Parameter(np.ones(n, np.float32))  # 4 MiB
    x = Tensor(np.ones(n, np.float32))
    tracemalloc.start()
    try:
        first = _peak_bytes(lambda: Dot.apply(x, w))
        later = [_peak_bytes(lambda: Dot.apply(x, w)) for _ in range(3)]
    finally:
        tracemalloc.stop()
    assert first >= w.asnumpy().nbytes  # the first call keeps the parameter (the type may write it)
    assert max(later) < w.asnumpy().nbytes // 8  # later ones keep nothing: no per-call copy


@pytest.fixture
def bridged(ops, torch_bridge, monkeypatch):
    """The same operators through to_torch's C++ bridge (src/core/autograd.cpp RunFunctionForeign)."""
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")
    import opbuilder
    monkeypatch.setenv("OPBUILDER_TORCH_BRIDGE", "1")
    return torch, opbuilder.to_torch(ops)


def test_through_the_torch_bridge_an_op_is_protected_from_its_first_write_on(bridged):
    torch, t_ops = bridged
    op = t_ops.write_if_3

    def fast() -> int:
        b = op.bridged[0]
        return 0 if b is None else b.fast_calls

    x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    op(x.detach().clone(), False, False)  # the signature's first call takes the Python path
    before = fast()
    op(x, False, False)  # a recorded call that writes nothing: nothing is kept from now on
    with pytest.raises(RuntimeError, match=r"^WriteIf<3>: a leaf Variable that requires grad is being used in an "
                                           r"in-place operation\.$"):
        op(x, True, True)  # torch's refusal, decided after the write (the documented hole)
    assert x.tolist() == [2.0, 2.0, 3.0]
    for _ in range(2):
        with pytest.raises(RuntimeError, match=r"^WriteIf<3>: a leaf Variable that requires grad"):
            op(x, True, True)  # decided before Forward: the data untouched
        assert x.tolist() == [2.0, 2.0, 3.0] and x.grad_fn is None
    assert fast() == before + 4
