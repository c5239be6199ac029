"""Train a small PyTorch model whose gating layer is the README's C++ operator.

    python examples/torch_train.py [--steps 200]

The operator is ``mul`` from custom_src/function_ops.cpp (a broadcasting
multiply with its C++ Backward), built on first use by ``CustomOpBuilder`` and
turned into a PyTorch operator by ``opbuilder.to_torch``. The model learns a
per-feature gate (an ``nn.Parameter`` multiplied in by the C++ op) in front
of a linear layer, on data made here; ``torch.optim.Adam`` updates both. The
op's gradients flow through torch's autograd into the C++ Backward.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a checkout without installing

import torch  # noqa: E402

import opbuilder  # noqa: E402


class GatedLinear(torch.nn.Module):
    """y = linear(mul(x, gate)): the gate goes through the C++ operator."""

    def __init__(self, ops, features: int) -> None:
        super().__init__()
        self.ops = ops
        self.gate = torch.nn.Parameter(torch.ones(features))
        self.linear = torch.nn.Linear(features, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.ops.mul(x, self.gate))


def train(steps: int = 200, seed: int = 0) -> List[float]:
    """Train on made-up data; the loss after each step."""
    torch.manual_seed(seed)
    ops = opbuilder.to_torch(opbuilder.CustomOpBuilder(
        "my_ops", [str(HERE.parent / "custom_src" / "function_ops.cpp")]).load())
    x = torch.randn(256, 8)
    true_w = torch.randn(8, 1)
    y = (x * torch.linspace(0.0, 2.0, 8)) @ true_w + 0.01 * torch.randn(256, 1)
    model = GatedLinear(ops, 8)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    args = p.parse_args(argv)
    losses = train(args.steps)
    print(f"loss: {losses[0]:.4f} -> {losses[-1]:.4f} after {args.steps} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
