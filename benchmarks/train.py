"""Training-step speed and memory: the runtime against PyTorch eager on the CPU, same run.

    python benchmarks/train.py [--threads 1] [--rounds 7]   # about a minute; torch optional

Rows (each side does the same work: same shapes, same data, float32, same thread count):
- MLP 784-256-256-10, batch 64, ReLU, cross-entropy, Adam: one training step
  (forward, backward, update). The runtime uses MindSpore's idiom
  (value_and_grad(..., optimizer.parameters, has_aux=True), optimizer(grads));
  torch uses zero_grad / backward / step.
- the overhead-bound MLP 784-32-32-10, batch 64, the same way.
- the big MLP with the custom C++ swish activation of examples/swish_op.cpp
  (opbuilder's Function<T>) in place of ReLU, against torch with the same two
  loops as a torch::autograd::Function (benchmarks/torch_swish.cpp, built by
  torch.utils.cpp_extension.load). Both built with the same flags: -O3 and the
  vectorizer flags opbuilder adds for gcc (SWISH_CFLAGS) on both sides.
- the engine: value_and_grad of a chain of 11 and 51 adds on 1-element
  tensors (per-node cost), and one built-in add recording grad on 1-element
  tensors (dispatch cost).
- peak memory (VmHWM) of a fresh process that imports its framework and
  trains the big MLP for 20 steps, one process per side.

Timings come from benchmarks/timing.py: interleaved rounds, each figure the median with the min-max,
ratios taken round by round; every side on --threads threads (default 1: the thread variables are set
before numpy and torch load, and torch.set_num_threads). Each goal prints MET or MISSED; a row that
cannot be measured (the peak-memory child failing) prints FAIL and the exit status is 1.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing  # noqa: E402  (first: pins the thread count before numpy and torch load)
from timing import THREADS, Report, Unmeasured, interleaved, ratio  # noqa: E402

import numpy as np  # noqa: E402

import runtime as rt  # noqa: E402
from runtime import Tensor, nn  # noqa: E402

HERE = timing.HERE
BATCH = 64
# one -O level and the vectorizer flags opbuilder's builder adds for gcc, given to both sides' builds
SWISH_CFLAGS = ["-O3", "-ftree-vectorize", "-fvect-cost-model=dynamic"]


def data(n_in: int, classes: int = 10):
    rng = np.random.default_rng(0)
    return rng.standard_normal((BATCH, n_in)).astype(np.float32), rng.integers(0, classes, BATCH).astype(np.int64)


# ---- the runtime's side ----------------------------------------------------------------
class _Swish(nn.Cell):
    def __init__(self, ops) -> None:
        super().__init__()
        self.ops = ops

    def construct(self, x):
        return self.ops.swish(x)


def load_rt_swish():
    from opbuilder import CustomOpBuilder
    return CustomOpBuilder("bench_swish_ops", [str(HERE.parent / "examples" / "swish_op.cpp")],
                           cflags=SWISH_CFLAGS).load()


def rt_step(sizes, swish_ops=None) -> Callable[[], object]:
    """One Adam step of an MLP; ReLU between layers, or the C++ swish when ``swish_ops`` is given."""
    rt.set_seed(0)
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Dense(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU() if swish_ops is None else _Swish(swish_ops))
    net = nn.SequentialCell(layers)
    loss_fn = nn.CrossEntropyLoss()
    opt = nn.Adam(net.trainable_params(), 1e-3)
    x, y = data(sizes[0], sizes[-1])
    x, y = Tensor(x), Tensor(y)

    def forward_fn(a, b):
        logits = net(a)
        return loss_fn(logits, b), logits

    grad_fn = rt.value_and_grad(forward_fn, None, opt.parameters, has_aux=True)

    def step():
        (loss, _), grads = grad_fn(x, y)
        opt(grads)
        return loss
    return step


def rt_chain(n: int) -> Callable[[], object]:
    x = Tensor(np.ones(1, np.float32))

    def f(a):
        for _ in range(n):
            a = a + 1.0
        return a
    vg = rt.value_and_grad(f)
    return lambda: vg(x)


def rt_add() -> Callable[[], object]:
    a = Tensor(np.ones(1, np.float32), requires_grad=True)
    b = Tensor(np.ones(1, np.float32))
    return lambda: a + b


# ---- torch's side -----------------------------------------------------------------------
def load_torch():
    return timing.load_torch()


def load_torch_swish(torch):
    from torch.utils.cpp_extension import load
    return load("bench_torch_swish", [str(HERE / "torch_swish.cpp")], extra_cflags=SWISH_CFLAGS, verbose=False)


def torch_step(torch, sizes, swish_ops=None) -> Callable[[], object]:
    """torch's side of ``rt_step``: the same layers, with the torch C++ swish when ``swish_ops`` is given."""
    torch.manual_seed(0)

    class Swish(torch.nn.Module):
        def forward(self, x):
            return swish_ops.swish(x)

    layers = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU() if swish_ops is None else Swish())
    net = torch.nn.Sequential(*layers)
    loss_fn = torch.nn.CrossEntropyLoss()
    opt = torch.optim.Adam(net.parameters(), 1e-3)
    x, y = data(sizes[0], sizes[-1])
    x, y = torch.from_numpy(x), torch.from_numpy(y)

    def step():
        opt.zero_grad()
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


def torch_chain(torch, n: int) -> Callable[[], object]:
    x = torch.ones(1)

    def run():
        a = x.clone().requires_grad_(True)  # a fresh leaf per call, as value_and_grad makes one
        out = a
        for _ in range(n):
            out = out + 1.0
        return out, torch.autograd.grad(out, a, torch.ones_like(out))
    return run


def torch_add(torch) -> Callable[[], object]:
    a = torch.ones(1, requires_grad=True)
    b = torch.ones(1)
    return lambda: a + b


# ---- peak memory in a fresh process -------------------------------------------------------
_MEM_SCRIPT = """
import sys
sys.argv = ["train.py", "--threads", "{threads}"]
import importlib.util
spec = importlib.util.spec_from_file_location("bench_train", {path!r})
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
if {side!r} == "torch":
    t = m.load_torch(); step = m.torch_step(t, (784, 256, 256, 10))
else:
    step = m.rt_step((784, 256, 256, 10))
for _ in range(20):
    step()
# VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, so a child of a process that loaded torch
# would report the parent's peak
print([line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")][0])
"""


def peak_mib(side: str) -> float:
    """VmHWM of a fresh process training the big MLP for 20 steps; Unmeasured when the child fails."""
    code = _MEM_SCRIPT.format(threads=THREADS, path=str(Path(__file__).resolve()), side=side)
    out = timing.run_child([sys.executable, "-c", code], timeout=600, what=f"the {side} peak-memory child")
    return int(out.stdout.split()[-1]) / 1024


def compare(report: Report, title: str, cases, number: int, rounds: int, unit: str, per: float,
            goal_text: str, limit: float) -> None:
    """One row: the runtime's figure, torch's when present, their ratio, and the goal on the ratio."""
    t = interleaved(cases, number, rounds)
    scale = lambda s: timing.Stat([v / per for v in s.samples])  # noqa: E731
    line = f"{title}: runtime {scale(t['runtime']).fmt(unit)}"
    if "torch" not in t:
        print(line)
        return
    r = ratio(t["runtime"], t["torch"])
    print(f"{line}, torch {scale(t['torch']).fmt(unit)}, runtime / torch {r.fmt('x')}")
    report.goal(f"{goal_text} <= {limit}x", r.median <= limit, f"{r.median:.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch = load_torch()
    timing.header("training step, runtime vs torch eager", args.rounds, torch)
    report = Report()

    rows = [
        ("MLP 784-256-256-10 Adam step", (784, 256, 256, 10), 10, 1.0, False),
        ("MLP 784-32-32-10 Adam step", (784, 32, 32, 10), 50, 1.1, False),
        ("MLP 784-256-256-10, C++ swish activation, Adam step", (784, 256, 256, 10), 10, 1.0, True),
    ]
    rt_swish = load_rt_swish()
    torch_swish = load_torch_swish(torch) if torch else None
    for title, sizes, number, limit, swish in rows:
        cases = {"runtime": rt_step(sizes, rt_swish if swish else None)}
        if torch:
            cases["torch"] = torch_step(torch, sizes, torch_swish if swish else None)
        compare(report, title, cases, number, args.rounds, "ms", 1, f"{title}: runtime / torch", limit)

    for n in (11, 51):
        cases = {"runtime": rt_chain(n)}
        if torch:
            cases["torch"] = torch_chain(torch, n)
        compare(report, f"value_and_grad of {n} adds (1 element), per node", cases, 200, args.rounds, "us", n,
                f"{n} adds: per-node cost, runtime / torch", 1.0)

    cases = {"runtime": rt_add()}
    if torch:
        cases["torch"] = torch_add(torch)
    compare(report, "add recording grad (1 element)", cases, 5000, args.rounds, "us", 1,
            "dispatch, runtime / torch", 1.0)

    title = "peak memory, 20 steps of the big MLP in a fresh process (one sample per side)"
    try:
        mine = peak_mib("runtime")
        theirs = peak_mib("torch") if torch else None
    except Unmeasured as e:
        report.fail(title, e)
    else:
        line = f"{title}: runtime {mine:.0f} MiB"
        if theirs is None:
            print(line)
        else:
            print(f"{line}, torch {theirs:.0f} MiB, ratio {mine / theirs:.2f}")
            report.goal("peak memory: runtime <= a quarter of torch's", mine <= theirs / 4,
                        f"{mine / theirs:.2f} of torch's")
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
