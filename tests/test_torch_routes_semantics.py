"""Every torch route of an op call decides a write as torch does (issue 33): to_torch's registered
(torch.library) path, its C++ bridge, torch.compile, and a runtime op called straight on torch tensors
(the DLPack route, no to_torch). Each case is compared with torch's own in-place op on the same inputs:
the same values and gradients, or a named refusal that leaves the data untouched.
Operators: tests/cpp/parity_ops.cpp (mul saves its inputs, scale_ is MarkDirty x *= 3, ident).
"""
from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")

import opbuilder  # noqa: E402
from op_util import CPP, load_op  # noqa: E402

pytestmark = pytest.mark.build


@pytest.fixture(scope="session")
def parity_ops(cache_dir):
    return load_op("parity_ops", [CPP / "parity_ops.cpp"])


@pytest.fixture(params=["registered", "bridge"])
def torch_route(request, monkeypatch):
    """to_torch's two eager routes: the registered operator (OPBUILDER_TORCH_BRIDGE=0) and the C++ bridge."""
    if request.param == "bridge":
        request.getfixturevalue("torch_bridge")
        monkeypatch.setenv("OPBUILDER_TORCH_BRIDGE", "1")
    else:
        monkeypatch.setenv("OPBUILDER_TORCH_BRIDGE", "0")
    return request.param


def _f64(*a, **kw) -> torch.Tensor:
    return torch.tensor(a, dtype=torch.float64, **kw)


# ---- MarkDirty on a view of a non-leaf: torch's CopySlices, 0-d views included --------------------
VIEWS = {
    "select (0-d)": lambda b: b[2],
    "view to 0-d": lambda b: b[1:2].view(()),
    "select a row": lambda b: b.view(2, 2)[1],
    "as_strided": lambda b: b.as_strided((2,), (2,), 1),
    "unsqueeze": lambda b: b.unsqueeze(0),
    "squeeze": lambda b: b.view(1, 4).squeeze(0),
    "diagonal": lambda b: b.view(2, 2).diagonal(),
}


def _write_view_then_backward(view, write):
    a = _f64(1.0, 2.0, 3.0, 4.0, requires_grad=True)
    b = a * 1.0
    write(view(b))
    (b * b).sum().backward()
    return a.grad, b.detach()


@pytest.mark.parametrize("view", list(VIEWS))
def test_markdirty_on_a_view_of_a_non_leaf_gives_torchs_gradient(parity_ops, torch_route, view):
    """scale_ (MarkDirty) on a view of a non-leaf, then backward through the base: torch's v.mul_(3) gives
    a.grad = 2 * b * (3 where written). The registered path failed for a 0-d view (b[2]) at backward:
    "output with shape [] doesn't match the broadcast shape [1]" (its gradient came back 1-d)."""
    ops = opbuilder.to_torch(parity_ops)
    want = _write_view_then_backward(VIEWS[view], lambda v: v.mul_(3))
    for _ in range(2):  # a signature's first call, then the route's later calls
        got = _write_view_then_backward(VIEWS[view], ops.scale_)
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("view", ["select (0-d)", "view to 0-d", "unsqueeze"])
def test_markdirty_on_a_view_under_compile_gives_torchs_gradient(parity_ops, monkeypatch, view):
    """The same under torch.compile (the op runs eagerly: it writes its argument)."""
    monkeypatch.setenv("OPBUILDER_TORCH_BRIDGE", "0")
    ops = opbuilder.to_torch(parity_ops)

    def run(write):
        def body(b):
            write(VIEWS[view](b))
            return (b * b).sum()
        a = _f64(1.0, 2.0, 3.0, 4.0, requires_grad=True)
        torch.compile(body, backend="eager")(a * 1.0).backward()
        return a.grad

    want = run(lambda v: v.mul_(3))
    ops.scale_(_f64(1.0))  # seen writing before it is compiled (else a named refusal: test_interop_torch)
    torch.testing.assert_close(run(ops.scale_), want, rtol=0, atol=0)


def test_markdirty_on_an_expanded_view_is_refused_as_torch_refuses(parity_ops, torch_route):
    """An expanded (stride-0) view is never written: torch's words, after the op's name; nothing changes."""
    ops = opbuilder.to_torch(parity_ops)
    b = _f64(1.0, 2.0, 3.0, 4.0, requires_grad=True) * 1.0
    with pytest.raises(RuntimeError, match=re.escape("unsupported operation: more than one element")):
        b[0:1].expand(3).mul_(3)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="^" + re.escape(
                "ParityScale modifies argument 0 in place (MarkDirty): unsupported operation: more than one "
                "element of the written-to tensor refers to a single memory location. Please clone() the tensor "
                "before performing the operation.") + "$"):
            ops.scale_(b[0:1].expand(3))
        assert b.tolist() == [1.0, 2.0, 3.0, 4.0]
