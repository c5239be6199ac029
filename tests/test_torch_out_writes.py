"""A to_torch function that writes an argument it does not declare (``mutates``), issue 33: the C++ bridge and
the registered path (OPBUILDER_TORCH_BRIDGE=0) give one answer, torch's out= rule. Each call of such a function
counts one write on the argument's version counter (so what another op saved sees it), and a write into a tensor
that requires grad is a named error, on its first call and on every later one.

The write is found by a checksum of every argument's bytes around the call (torch_writes.py, from interop_torch.py's
``_Op.record``): on a signature's first call on any route, and on every call of a signature seen returning nothing or
writing an argument unseen. The bridge takes only signatures whose first call wrote nothing (``_Op.checked``).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")

import opbuilder  # noqa: E402
from opbuilder import Spec  # noqa: E402
from opbuilder.bridges.interop_torch import op_handle  # noqa: E402
from op_util import CPP, load_op  # noqa: E402

pytestmark = pytest.mark.build

DOUBLE = torch.float64
NAMED = (r"^{}\(\) wrote tensor argument 2 in place, which requires grad; functions with out=\.\.\. arguments "
         r"don't support automatic differentiation\. Its data has already changed: declare the write "
         r"\(to_torch\(\.\.\., mutates=\{{'{}': \[positions\]\}}\)\) so such a call is refused before it runs")
MODIFIED = r"one of the variables needed for gradient computation has been modified by an inplace operation"
WRITERS = ("add_out", "add_ret_out")


@pytest.fixture(scope="module")
def out_ops(cache_dir):
    """tests/cpp/torch_out_write_ops.cpp: add_out (returns nothing), add_ret_out (returns x + y and writes it
    into its third argument too), add (writes nothing)."""
    return load_op("torch_out_write_ops", [CPP / "torch_out_write_ops.cpp"])


def _t(*values, grad=False):
    return torch.tensor(values, dtype=DOUBLE, requires_grad=grad)


def _fast(fn) -> int:
    """The calls the C++ bridge's fast path took for ``fn`` (0 on the registered route)."""
    op = getattr(fn, "bridged", [None])[0]
    return 0 if op is None else op.fast_calls


@pytest.mark.parametrize("name", WRITERS)
def test_each_call_of_an_undeclared_writer_bumps_the_version(out_ops, torch_route, name):
    fn = getattr(opbuilder.to_torch(out_ops), name)
    o = _t(0.0, 0.0)
    for k in range(4):  # the first call, then later ones (the bridge's, when it is on)
        v = o._version
        fn(_t(1.0, float(k)), _t(2.0, 2.0), o)
        assert o.tolist() == [3.0, 2.0 + k]
        assert o._version == v + 1, f"call {k}"  # torch.add(a, b, out=o) counts one write


@pytest.mark.parametrize("name", WRITERS)
@pytest.mark.parametrize("where", (0, 1234, 8191))
def test_a_sparse_undeclared_write_into_a_large_tensor_bumps_the_version(out_ops, torch_route, name, where):
    """Only one element of 8192 doubles changes: a checksum of every byte sees it, where a sample of 256
    elements mostly did not (attack on 4961d16)."""
    fn = getattr(opbuilder.to_torch(out_ops), name)
    x, y = torch.ones(8192, dtype=DOUBLE), torch.ones(8192, dtype=DOUBLE)
    o = torch.full((8192,), 2.0, dtype=DOUBLE)
    for k in range(3):
        o[where] = 0.0  # the one element the call writes
        v = o._version
        fn(x, y, o)
        assert o[where].item() == 2.0
        assert o._version == v + 1, f"call {k}"


@pytest.mark.parametrize("name", WRITERS)
@pytest.mark.parametrize("kind", ("leaf", "nonleaf", "view"))
def test_each_call_writing_a_tensor_that_requires_grad_is_a_named_error(out_ops, torch_route, name, kind):
    fn = getattr(opbuilder.to_torch(out_ops), name)
    fn(_t(1.0, 1.0), _t(2.0, 2.0), _t(0.0, 0.0))  # the signature's first call: it writes nothing needing grad
    for k in range(3):
        x = _t(0.0, 0.0, 0.0, grad=True) if kind == "view" else _t(0.0, 0.0, grad=True)
        o = x if kind == "leaf" else x * 1 if kind == "nonleaf" else (x * 1)[1:]
        with pytest.raises(RuntimeError, match=NAMED.format(name, name)):
            fn(_t(1.0, float(k)), _t(2.0, 2.0), o)
        assert o.tolist() == [3.0, 2.0 + k]  # found after the call: the message says the data changed
        assert x.grad is None


@pytest.mark.parametrize("name", WRITERS)
def test_writing_a_tensor_that_requires_grad_under_no_grad_counts_the_write(out_ops, torch_route, name):
    fn = getattr(opbuilder.to_torch(out_ops), name)
    x = _t(0.0, 0.0, grad=True)
    with torch.no_grad():  # torch's out= is allowed without grad recording
        for k in range(3):
            v = x._version
            fn(_t(1.0, float(k)), _t(2.0, 2.0), x)
            assert (x.tolist(), x._version) == ([3.0, 2.0 + k], v + 1)


@pytest.mark.parametrize("name", WRITERS)
@pytest.mark.parametrize("warm", (False, True))
def test_a_tensor_saved_by_another_op_then_written_fails_its_backward(out_ops, torch_route, name, warm):
    fn = getattr(opbuilder.to_torch(out_ops), name)
    if warm:
        fn(_t(1.0, 1.0), _t(2.0, 2.0), _t(0.0, 0.0))  # later calls take the bridge's route, when it is on
    x, y = _t(1.0, 2.0, grad=True), _t(3.0, 4.0)
    z = x * y  # torch saves y
    fn(_t(5.0, 5.0), _t(5.0, 5.0), y)
    with pytest.raises(RuntimeError, match=MODIFIED):  # torch's own words, as after torch.add(.., out=y)
        z.sum().backward()


@pytest.mark.parametrize("how", ("op_handle", "shape_rule"))
def test_a_signature_defined_before_its_first_eager_call_is_watched_on_it(out_ops, torch_route, how):
    if how == "shape_rule":  # the rule defines the operator with its output known, before any call runs
        ns = opbuilder.to_torch(out_ops, shape_fn={"add_ret_out": lambda x, y, o: Spec(x.shape, x.dtype)})
    else:
        ns = opbuilder.to_torch(out_ops)
        op_handle(ns.add_ret_out, _t(1.0, 1.0), _t(2.0, 2.0), _t(0.0, 0.0))  # defined, not run
    o = _t(0.0, 0.0)
    for k in range(3):
        v = o._version
        assert ns.add_ret_out(_t(1.0, float(k)), _t(2.0, 2.0), o).tolist() == [3.0, 2.0 + k]
        assert o._version == v + 1, f"call {k}"
    with pytest.raises(RuntimeError, match=NAMED.format("add_ret_out", "add_ret_out")):
        ns.add_ret_out(_t(1.0, 1.0), _t(2.0, 2.0), _t(0.0, 0.0, grad=True) * 1)


@pytest.mark.parametrize("name", WRITERS)
def test_an_undeclared_write_inside_a_compiled_function_fails_the_backward_of_what_saved_it(out_ops, torch_route,
                                                                                               name):
    fn = getattr(opbuilder.to_torch(out_ops), name)

    def f(a, y):
        fn(a, a, y)  # no shape rule: the call runs eagerly (a graph break), as every later call
        return a * 2

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="eager")
    for k in range(3):
        x, y = _t(1.0, 2.0, grad=True), _t(3.0, 4.0)
        z = x * y  # torch saves y
        v = y._version
        assert compiled(_t(1.0, float(k)), y).tolist() == [2.0, 2.0 * k]
        assert (y.tolist(), y._version) == ([2.0, 2.0 * k], v + 1), f"call {k}"
        with pytest.raises(RuntimeError, match=MODIFIED):
            z.sum().backward()
    torch._dynamo.reset()


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.complex128, torch.int8, torch.bool))
def test_an_undeclared_write_into_any_dtype_counts(out_ops, torch_route, dtype):
    fn = opbuilder.to_torch(out_ops).copy_out
    o = torch.zeros(3, dtype=dtype)
    for k in range(3):
        x = torch.tensor([k % 2, 1 - k % 2, 1], dtype=dtype)  # each call writes new bytes
        v = o._version
        fn(x, o)
        assert torch.equal(o, x) and o._version == v + 1, f"call {k}"
    if dtype.is_floating_point or dtype.is_complex:
        o = torch.zeros(3, dtype=dtype, requires_grad=True) * 1
        with pytest.raises(RuntimeError, match=r"^copy_out\(\) wrote tensor argument 1 in place, which requires grad"):
            fn(torch.ones(3, dtype=dtype), o)
        assert o.tolist() == torch.ones(3, dtype=dtype).tolist()


@pytest.mark.parametrize("view", ("conj", "neg"))
def test_an_undeclared_write_into_a_conjugate_or_negative_view_is_a_named_error(out_ops, torch_route, view):
    fn = opbuilder.to_torch(out_ops).copy_out
    base = torch.tensor([1 + 1j, 2 + 2j, 3 + 3j], dtype=torch.complex128)
    o = base.conj() if view == "conj" else torch._neg_view(base)
    kind = "conjugate" if view == "conj" else "negative"
    for k in range(3):  # the op writes the resolved copy it gets: refused on every call, never lost silently
        with pytest.raises(RuntimeError, match=rf"^copy_out modifies argument 1 in place \(an undeclared write\), "
                                               rf"but it is a {kind} view .* the argument is unchanged$"):
            fn(torch.full((3,), 5 + k * 1j, dtype=torch.complex128), o)
        assert base.tolist() == [1 + 1j, 2 + 2j, 3 + 3j]


def test_a_function_writing_nothing_keeps_the_bridges_fast_path(out_ops, torch_bridge, monkeypatch):
    monkeypatch.setenv("OPBUILDER_TORCH_BRIDGE", "1")
    ns = opbuilder.to_torch(out_ops)
    x, y = _t(1.0, 2.0, grad=True), _t(3.0, 4.0)
    ns.add(x, y)  # the first call: fingerprinted on the registered path, no write found
    before = _fast(ns.add)
    v = y._version
    assert ns.add(x, y).tolist() == [4.0, 6.0]
    with torch.no_grad():
        assert ns.add(x, y).tolist() == [4.0, 6.0]
    assert _fast(ns.add) == before + 2 and y._version == v
    for name in WRITERS:  # writers stay on the registered path, where each call is watched
        fn = getattr(ns, name)
        for _ in range(3):
            fn(_t(1.0, 1.0), _t(2.0, 2.0), _t(0.0, 0.0))
        assert _fast(fn) == 0


@pytest.mark.parametrize("name", WRITERS)
def test_a_declared_write_is_counted_and_refused_on_every_call(out_ops, torch_route, name):
    fn = getattr(opbuilder.to_torch(out_ops, mutates={name: [2]}), name)
    o = _t(0.0, 0.0)
    for k in range(3):
        v = o._version
        fn(_t(1.0, float(k)), _t(2.0, 2.0), o)
        assert (o.tolist(), o._version) == ([3.0, 2.0 + k], v + 1), f"call {k}"
        x = _t(7.0, 7.0, grad=True) * 1
        with pytest.raises(RuntimeError, match=rf"^{name}\(\): functions with out=\.\.\. arguments don't support "
                                               r"automatic differentiation, but one of the arguments requires grad"):
            fn(_t(1.0, 1.0), _t(2.0, 2.0), x)
        assert x.tolist() == [7.0, 7.0]  # decided before the call: untouched
