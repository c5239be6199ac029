"""A to_torch call through the C++ bridge (src/torch_bridge.cpp) is active only in the Python frame
that made it: Python code the call runs (a saved_tensors_hooks pack hook) is another frame, so an
operator it calls on torch tensors is a call of its own, straight, and returns runtime tensors. The
bridge tells frames apart by the interpreter's own frame record, not a frame object made per call.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")

import opbuilder  # noqa: E402
import runtime as rt  # noqa: E402

pytestmark = pytest.mark.build


def test_an_op_called_by_a_hook_inside_a_bridge_call_is_a_call_of_its_own(my_ops, torch_bridge, monkeypatch):
    monkeypatch.setenv("OPBUILDER_TORCH_BRIDGE", "1")
    t = opbuilder.to_torch(my_ops)
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    t.mul(x.detach(), x.detach())  # the signature's first call defines it (the Python path)
    t.mul(x.detach(), x.detach())  # the bridge's Op is made
    inner = []

    def pack(saved):
        inner.append(my_ops.mul(saved.detach(), saved.detach()))  # in the hook's own frame
        return saved

    before = t.mul.bridged[0].fast_calls
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda saved: saved):
        z = t.mul(x, x)  # records a node: what Forward saves goes through the pack hook
    assert t.mul.bridged[0].fast_calls == before + 1  # the outer call took the bridge
    assert type(z) is torch.Tensor and z.tolist() == [1.0, 4.0, 9.0]
    assert inner and all(type(r) is rt.Tensor for r in inner)
    assert [r.asnumpy().tolist() for r in inner] == [[1.0, 4.0, 9.0]] * len(inner)
    (gx,) = torch.autograd.grad(z.sum(), (x,))
    assert gx.tolist() == [2.0, 4.0, 6.0]
