"""What a call to a C++ operator costs: opbuilder's Function against PyTorch's, same kernel, same run.

    python benchmarks/call_overhead.py            # about two minutes (plus a first build)

The 50M-element row is dominated by the output's allocation: a fresh 200 MB
buffer costs ~50,000 page faults on first touch unless it gets transparent
huge pages, which numpy asks for and opbuilder::Tensor now does too.

Every operator runs bench::MulKernel (benchmarks/mul_kernel.h), built -O3:
opbuilder's Function<T> (benchmarks/opbuilder_mul.cpp) and, when torch is
installed, a torch::autograd::Function (benchmarks/torch_function_mul.cpp,
built with torch.utils.cpp_extension.load). numpy.multiply and torch.mul
are there for scale; "floor" is a bare pybind11 call doing what any call must
(read two buffers, allocate the output, wrap it in a runtime.Tensor).

Timings: each case is timed in rounds, round-robin with the others of its
group, and the best round counts (the mean of one round's calls), so that
load from other processes hurts every contender alike and as little as
possible. torch runs on one thread, as every other contender does.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path
from typing import Callable, Dict, Optional

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a checkout without installing
from timing import best_of  # noqa: E402  (benchmarks/timing.py)

import runtime as rt  # noqa: E402
from runtime import Tensor  # noqa: E402


def load_opbuilder():
    from opbuilder import CustomOpBuilder
    return CustomOpBuilder("bench_mul", [str(HERE / "opbuilder_mul.cpp")], cflags=["-O3"]).load()


def load_torch():
    try:
        import torch
        from torch.utils.cpp_extension import load
    except ImportError:
        return None, None
    torch.set_num_threads(1)
    ext = load("bench_torch_function_mul", [str(HERE / "torch_function_mul.cpp")], extra_cflags=["-O3"],
               extra_include_paths=[str(HERE)], verbose=False)
    return torch, ext


def us(t: Optional[float]) -> str:
    return "—" if t is None else f"{t * 1e6:9.2f} us"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15, help="rounds per case (default 15)")
    args = ap.parse_args(argv)
    R = args.rounds

    ob = load_opbuilder()
    torch, tf = load_torch()
    have_torch = torch is not None

    rows = []  # (case, opbuilder, torch Function, numpy, torch.mul, floor)

    # ---- one element -----------------------------------------------------------------
    xa, ya = np.ones(1, np.float32) * 2, np.ones(1, np.float32) * 3
    x, y = Tensor(xa), Tensor(ya)
    xg = Tensor(xa, requires_grad=True)
    cases = {"ob": lambda: ob.mul(x, y), "floor": lambda: ob.floor_call(x, y), "np": lambda: np.multiply(xa, ya)}
    if have_torch:
        tx, ty = torch.from_numpy(xa.copy()), torch.from_numpy(ya.copy())
        cases.update({"tf": lambda: tf.mul(tx, ty), "tmul": lambda: torch.mul(tx, ty)})
    r = best_of(cases, 20000, R)
    rows.append(("forward, no grad, 1 element", r["ob"], r.get("tf"), r["np"], r.get("tmul"), r["floor"]))

    cases = {"ob": lambda: ob.mul(xg, y)}
    if have_torch:
        txg = tx.clone().requires_grad_(True)
        cases.update({"tf": lambda: tf.mul(txg, ty), "tmul": lambda: torch.mul(txg, ty)})
    r = best_of(cases, 20000, R)
    rows.append(("forward, recording grad, 1 element", r["ob"], r.get("tf"), None, r.get("tmul"), None))

    vg = rt.value_and_grad(lambda a, b: ob.mul(a, b), grad_position=(0, 1))
    cases = {"ob": lambda: vg(x, y)}
    if have_torch:
        tyg = ty.clone().requires_grad_(True)

        def torch_vg(f):
            def run():
                out = f(txg, tyg)
                return out, torch.autograd.grad(out, (txg, tyg))
            return run
        cases.update({"tf": torch_vg(tf.mul), "tmul": torch_vg(torch.mul)})
    r = best_of(cases, 2000, R)
    rows.append(("value_and_grad (forward + backward), 1 element", r["ob"], r.get("tf"), None, r.get("tmul"),
                 None))

    # a 10-op chain (5 custom muls, 5 built-in adds): per-node cost, no one-node shortcut
    def chain(mul, add):
        def f(a, b):
            z = a
            for _ in range(5):
                z = add(mul(z, b), a)
            return z
        return f
    vg10 = rt.value_and_grad(chain(ob.mul, rt.ops.add), grad_position=(0, 1))
    cases = {"ob": lambda: vg10(x, y)}
    if have_torch:
        cases["tf"] = torch_vg(chain(tf.mul, torch.add))
    r = best_of(cases, 500, R)
    rows.append(("value_and_grad, 10-op chain (5 custom, 5 built-in), 1 element", r["ob"], r.get("tf"), None,
                 None, None))

    # ---- one million elements --------------------------------------------------------------
    n = 1 << 20
    rng = np.random.default_rng(0)
    xa, ya = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    x, y, xg = Tensor(xa), Tensor(ya), Tensor(xa, requires_grad=True)
    out = ob.mul(x, y)  # the kernel loop's output: memory from the same allocator as the calls' outputs
    cases = {"ob": lambda: ob.mul(x, y), "ob_rec": lambda: ob.mul(xg, y),
             "np": lambda: np.multiply(xa, ya), "floor": lambda: ob.floor_call(x, y)}
    if have_torch:
        tx, ty = torch.from_numpy(xa.copy()), torch.from_numpy(ya.copy())
        cases.update({"tf": lambda: tf.mul(tx, ty), "tmul": lambda: torch.mul(tx, ty)})
    reps = 10
    kernel = float("inf")
    best = {k: float("inf") for k in cases}
    for _ in range(3 * R):  # the kernel loop takes its turn in the round-robin too; more rounds (noisier)
        kernel = min(kernel, ob.kernel_seconds(x, y, out, reps))
        for k, v in best_of(cases, reps, 1).items():
            best[k] = min(best[k], v)
    rows.append((f"forward, no grad, {n} elements", best["ob"], best.get("tf"), best["np"], best.get("tmul"),
                 best["floor"]))
    rows.append((f"forward, recording grad, {n} elements", best["ob_rec"], None, None, None, None))

    # ---- fifty million elements: the output's allocation and first touch dominate ----------
    n50 = 50_000_000
    xa, ya = rng.standard_normal(n50).astype(np.float32), rng.standard_normal(n50).astype(np.float32)
    x, y = Tensor(xa), Tensor(ya)
    cases = {"ob": lambda: ob.mul(x, y), "np": lambda: np.multiply(xa, ya), "floor": lambda: ob.floor_call(x, y)}
    if have_torch:
        tx, ty = torch.from_numpy(xa), torch.from_numpy(ya)
        cases.update({"tf": lambda: tf.mul(tx, ty), "tmul": lambda: torch.mul(tx, ty)})
    r50 = best_of(cases, 1, max(3, R // 3))
    rows.append((f"forward, no grad, {n50} elements", r50["ob"], r50.get("tf"), r50["np"], r50.get("tmul"),
                 r50["floor"]))
    del x, y, xa, ya, cases

    # ---- report --------------------------------------------------------------------------------
    import numpy
    print(f"python {platform.python_version()}, numpy {numpy.__version__}, "
          f"torch {torch.__version__ if have_torch else 'not installed'}; {platform.processor() or platform.machine()}"
          f", {os.cpu_count()} cpus; best of {R} rounds ({3 * R} for 1M elements)")
    print()
    head = ["case", "opbuilder Function", "torch C++ Function", "ratio ob/torch", "numpy.multiply", "torch.mul",
            "floor (bare pybind11)"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for case, o, t, npy, tm, fl in rows:
        ratio = f"{o / t:.2f}" if t else "—"
        print(f"| {case} | {us(o)} | {us(t)} | {ratio} | {us(npy)} | {us(tm)} | {us(fl)} |")
    print()
    ob_ng, ob_rec = best["ob"], best["ob_rec"]
    floor1m = best["floor"]
    print(f"1M elements: the floor (a bare pybind11 call: numpy allocates the output, the same kernel runs) "
          f"{us(floor1m).strip()}; opbuilder call {ob_ng / floor1m - 1:+.2%} over it (recording grad: "
          f"{ob_rec / floor1m - 1:+.2%}); the kernel loop alone over a preallocated output {us(kernel).strip()} "
          f"(for scale only: it skips the output's allocation and first touch, so it is no bound).")
    print()
    goals = [("forward, no grad, 1 element <= 1.5 us", rows[0][1] <= 1.5e-6)]
    if have_torch:
        goals.append(("forward, no grad, 1 element <= torch C++ Function", rows[0][1] <= rows[0][2]))
    goals.append(("forward, recording grad, 1 element <= 3 us", rows[1][1] <= 3e-6))
    if have_torch:
        goals.append(("value_and_grad, 1 element <= torch C++ Function forward+backward", rows[2][1] <= rows[2][2]))
    goals.append(("1M elements: call within 3% of the floor (same allocation and kernel)", ob_ng / floor1m - 1 < 0.03))
    if have_torch:
        goals.append(("value_and_grad, 10-op chain <= torch C++ Function", rows[3][1] <= rows[3][2]))
    print(f"50M elements: opbuilder / numpy.multiply = {r50['ob'] / r50['np']:.2f}")
    goals.append(("50M elements: opbuilder within 1.2x of numpy.multiply", r50["ob"] <= 1.2 * r50["np"]))
    for text, ok in goals:
        print(f"[{'met' if ok else 'MISSED'}] {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
