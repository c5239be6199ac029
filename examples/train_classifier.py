"""Train a small classifier whose activation is a custom C++ op, with MindSpore's training idiom.

    python examples/train_classifier.py [--steps 300] [--out DIR]

The activation, Swish (x * sigmoid(x)), is the C++ ``Function`` in
examples/swish_op.cpp, built on first use by ``CustomOpBuilder`` (cached
afterwards). The data -- three interleaved spirals in 2-D -- are generated
here. Training uses ``value_and_grad(forward_fn, None, optimizer.parameters,
has_aux=True)`` and ``nn.Adam``; the weights are saved with
``save_checkpoint`` and loaded back into a fresh network. A progress bar
appears when ``tqdm`` is installed, a loss-curve PNG when ``matplotlib`` is.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a checkout without installing

import runtime as rt  # noqa: E402
from runtime import Tensor, nn, ops  # noqa: E402
from opbuilder import CustomOpBuilder  # noqa: E402


def spirals(n_per_class: int, classes: int = 3, seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """Points on ``classes`` noisy interleaved spiral arms, and their arm index."""
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for c in range(classes):
        r = np.linspace(0.05, 1.0, n_per_class)
        theta = np.linspace(c * 2 * np.pi / classes, c * 2 * np.pi / classes + 4.0, n_per_class)
        theta = theta + rng.normal(0, 0.2, n_per_class)
        xs.append(np.stack([r * np.sin(theta), r * np.cos(theta)], 1))
        ys.append(np.full(n_per_class, c))
    return np.concatenate(xs).astype(np.float32), np.concatenate(ys).astype(np.int32)


class SwishCell(nn.Cell):
    """The custom C++ op as a layer."""

    def __init__(self, swish_ops: Any) -> None:
        super().__init__()
        self.swish_ops = swish_ops

    def construct(self, x: Tensor) -> Tensor:
        return self.swish_ops.swish(x)


class Classifier(nn.Cell):
    def __init__(self, swish_ops: Any, hidden: int = 64, classes: int = 3) -> None:
        super().__init__()
        self.body = nn.SequentialCell([
            nn.Dense(2, hidden), SwishCell(swish_ops),
            nn.Dense(hidden, hidden), SwishCell(swish_ops),
            nn.Dense(hidden, classes),
        ])

    def construct(self, x: Tensor) -> Tensor:
        return self.body(x)


def _progress(steps: int, quiet: bool):
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=steps, desc="train", disable=quiet)


def _plot(losses: List[float], path: Path) -> Optional[Path]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot(losses)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    ax.set_yscale("log")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def accuracy(net: nn.Cell, x: Tensor, y: np.ndarray) -> float:
    with rt.no_grad():
        return float((ops.argmax(net(x), 1).asnumpy() == y).mean())


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("train_classifier_out"))
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    swish_ops = CustomOpBuilder("swish_ops", [str(HERE / "swish_op.cpp")], backend="CPU").load()
    rt.set_seed(args.seed)
    x_np, y_np = spirals(200, seed=args.seed)
    x, y = Tensor(x_np), Tensor(y_np)
    net = Classifier(swish_ops)
    loss_fn = nn.CrossEntropyLoss()
    optimizer = nn.Adam(net.trainable_params(), learning_rate=args.lr)

    def forward_fn(data: Tensor, label: Tensor):
        logits = net(data)
        return loss_fn(logits, label), logits

    grad_fn = rt.value_and_grad(forward_fn, None, optimizer.parameters, has_aux=True)

    losses: List[float] = []
    bar = _progress(args.steps, args.quiet)
    net.set_train()
    for step in range(args.steps):
        (loss, _), grads = grad_fn(x, y)
        optimizer(grads)
        losses.append(loss.item())
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.4f}")
        elif not args.quiet and (step % 50 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {losses[-1]:.4f}")
    if bar is not None:
        bar.close()
    net.set_train(False)
    acc = accuracy(net, x, y_np)

    ckpt = args.out / "classifier.safetensors"
    rt.save_checkpoint(net, ckpt)
    restored = Classifier(swish_ops)
    not_loaded, unused = rt.load_param_into_net(restored, rt.load_checkpoint(ckpt))
    restored_acc = accuracy(restored, x, y_np)
    png = _plot(losses, args.out / "loss.png")
    if not args.quiet:
        print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}; accuracy {acc:.3f}; checkpoint {ckpt} "
              f"(reloaded accuracy {restored_acc:.3f})" + (f"; loss curve {png}" if png else ""))
    return {"losses": losses, "accuracy": acc, "restored_accuracy": restored_acc, "checkpoint": ckpt,
            "not_loaded": not_loaded, "unused": unused, "plot": png}


if __name__ == "__main__":
    main()
