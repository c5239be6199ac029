"""to_torch over Python functions of runtime tensors (no C++): every call returns torch tensors with the
function's values, on every call of a signature (the lean path of later eager calls is for C++ functions
only: it hands them numpy arrays, which a Python function would compute on and return as they are)."""
from __future__ import annotations

import types

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")

import opbuilder  # noqa: E402


@pytest.mark.parametrize("bridge", ["0", "1"])
def test_every_call_of_a_python_function_returns_torch_tensors(monkeypatch, bridge):
    monkeypatch.setenv("OPBUILDER_TORCH_BRIDGE", bridge)  # "1": nothing to bridge (not C++), same answer
    t = opbuilder.to_torch(types.SimpleNamespace(f=lambda x, s: x * 0 + s))
    x = torch.zeros(2, dtype=torch.float64)
    for s in [2, 3, 4, 5, 2.0, 3.0, 2.5, 4.5]:
        out = t.f(x, s)
        assert type(out) is torch.Tensor
        np.testing.assert_array_equal(out.numpy(), [s, s])
