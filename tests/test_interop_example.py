"""examples/torch_train.py: the README's C++ operator trained inside a PyTorch model."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")

pytestmark = pytest.mark.build
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "torch_train.py"


def _example():
    spec = importlib.util.spec_from_file_location("torch_train", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_torch_train_example_learns(cache_dir, capsys):
    ex = _example()
    losses = ex.train(steps=40)
    assert len(losses) == 40
    assert losses[-1] < 0.5 * losses[0]
    # the gate is a parameter of the model, trained through the C++ Backward
    assert ex.main(["--steps", "3"]) == 0
    assert capsys.readouterr().out.startswith("loss: ")


def test_gate_gradient_comes_from_the_cpp_op(my_ops):
    ex = _example()
    import opbuilder
    model = ex.GatedLinear(opbuilder.to_torch(my_ops), 3).double()
    x = torch.randn(5, 3, dtype=torch.float64)
    model(x).sum().backward()
    expect = (x * model.linear.weight.detach()).sum(0)
    torch.testing.assert_close(model.gate.grad, expect)
