"""What a call to a C++ operator costs: opbuilder's Function against PyTorch's, same kernel, same run.

    python benchmarks/call_overhead.py [--rounds 7]   # about a minute (plus a first build)

Every operator runs bench::MulKernel (benchmarks/mul_kernel.h), built -O3:
opbuilder's Function<T> (benchmarks/opbuilder_mul.cpp) and, when torch is
installed, a torch::autograd::Function (benchmarks/torch_function_mul.cpp,
built with torch.utils.cpp_extension.load). numpy.multiply and torch.mul
are there for scale; "floor" is a bare pybind11 call doing what any call must
(read two buffers, allocate the output, wrap it in a runtime.Tensor).

The 50M-element rows come twice. With a fresh output per call, the figure is
mostly the output's allocation and first touch: a 200 MB buffer costs ~50,000
page faults unless it gets transparent huge pages, which numpy and
opbuilder::Tensor ask for and torch's CPU allocator does not, so torch's
columns there measure its allocator, not its kernel. With a preallocated
output (numpy ``out=``, torch ``out=``, opbuilder's kernel loop) every side
runs only the multiply.

Timings: benchmarks/timing.py; each group of cases in interleaved rounds,
figures are medians with min-max; one thread on every side.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing  # noqa: E402  (first: pins the thread count before numpy and torch load)
from timing import Report, Stat, interleaved, ratio  # noqa: E402

import numpy as np  # noqa: E402

import runtime as rt  # noqa: E402
from runtime import Tensor  # noqa: E402

HERE = timing.HERE


def load_opbuilder():
    from opbuilder import CustomOpBuilder
    return CustomOpBuilder("bench_mul", [str(HERE / "opbuilder_mul.cpp")], cflags=["-O3"]).load()


def load_torch():
    torch = timing.load_torch()
    if torch is None:
        return None, None
    from torch.utils.cpp_extension import load
    ext = load("bench_torch_function_mul", [str(HERE / "torch_function_mul.cpp")], extra_cflags=["-O3"],
               extra_include_paths=[str(HERE)], verbose=False)
    return torch, ext


def us(t: Optional[Stat]) -> str:
    return "—" if t is None else t.fmt("auto")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds per group (default 7)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    R = args.rounds

    ob = load_opbuilder()
    torch, tf = load_torch()
    have_torch = torch is not None
    timing.header("what a call to a C++ operator costs", R, torch)
    report = Report()

    rows = []  # (case, opbuilder, torch Function, numpy, torch.mul, floor): Stats or None

    # ---- one element -----------------------------------------------------------------
    xa, ya = np.ones(1, np.float32) * 2, np.ones(1, np.float32) * 3
    x, y = Tensor(xa), Tensor(ya)
    xg = Tensor(xa, requires_grad=True)
    cases = {"ob": lambda: ob.mul(x, y), "floor": lambda: ob.floor_call(x, y), "np": lambda: np.multiply(xa, ya)}
    if have_torch:
        tx, ty = torch.from_numpy(xa.copy()), torch.from_numpy(ya.copy())
        cases.update({"tf": lambda: tf.mul(tx, ty), "tmul": lambda: torch.mul(tx, ty)})
    r1 = interleaved(cases, 10000, R)
    rows.append(("forward, no grad, 1 element", r1["ob"], r1.get("tf"), r1["np"], r1.get("tmul"), r1["floor"]))

    cases = {"ob": lambda: ob.mul(xg, y)}
    if have_torch:
        txg = tx.clone().requires_grad_(True)
        cases.update({"tf": lambda: tf.mul(txg, ty), "tmul": lambda: torch.mul(txg, ty)})
    r2 = interleaved(cases, 10000, R)
    rows.append(("forward, recording grad, 1 element", r2["ob"], r2.get("tf"), None, r2.get("tmul"), None))

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
    r3 = interleaved(cases, 2000, R)
    rows.append(("value_and_grad (forward + backward), 1 element", r3["ob"], r3.get("tf"), None, r3.get("tmul"),
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
    r4 = interleaved(cases, 500, R)
    rows.append(("value_and_grad, 10-op chain (5 custom, 5 built-in), 1 element", r4["ob"], r4.get("tf"), None,
                 None, None))

    # ---- one million elements --------------------------------------------------------------
    n = 1 << 20
    rng = np.random.default_rng(0)
    xa, ya = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    x, y, xg = Tensor(xa), Tensor(ya), Tensor(xa, requires_grad=True)
    out = ob.mul(x, y)  # the kernel loop's output: memory from the same allocator as the calls' outputs
    cases = {"ob": lambda: ob.mul(x, y), "ob_rec": lambda: ob.mul(xg, y), "np": lambda: np.multiply(xa, ya),
             "floor": lambda: ob.floor_call(x, y), "kernel": lambda: ob.kernel_seconds(x, y, out, 1)}
    if have_torch:
        tx, ty = torch.from_numpy(xa.copy()), torch.from_numpy(ya.copy())
        cases.update({"tf": lambda: tf.mul(tx, ty), "tmul": lambda: torch.mul(tx, ty)})
    rm = interleaved(cases, 10, 2 * R)
    rows.append((f"forward, no grad, {n} elements", rm["ob"], rm.get("tf"), rm["np"], rm.get("tmul"), rm["floor"]))
    rows.append((f"forward, recording grad, {n} elements", rm["ob_rec"], None, None, None, None))

    # ---- fifty million elements: a fresh output per call, then a preallocated one -----------
    n50 = 50_000_000
    xa, ya = rng.standard_normal(n50).astype(np.float32), rng.standard_normal(n50).astype(np.float32)
    x, y = Tensor(xa), Tensor(ya)
    cases = {"ob": lambda: ob.mul(x, y), "np": lambda: np.multiply(xa, ya), "floor": lambda: ob.floor_call(x, y)}
    if have_torch:
        tx, ty = torch.from_numpy(xa), torch.from_numpy(ya)
        cases.update({"tf": lambda: tf.mul(tx, ty), "tmul": lambda: torch.mul(tx, ty)})
    r50 = interleaved(cases, 2, R)
    rows.append((f"forward, no grad, {n50} elements, fresh output (allocation + first touch)", r50["ob"],
                 r50.get("tf"), r50["np"], r50.get("tmul"), r50["floor"]))
    out50, buf = ob.mul(x, y), np.empty_like(xa)
    cases = {"ob": lambda: ob.kernel_seconds(x, y, out50, 1), "np": lambda: np.multiply(xa, ya, out=buf)}
    if have_torch:
        tbuf = torch.empty(n50)
        cases["tmul"] = lambda: torch.mul(tx, ty, out=tbuf)
    p50 = interleaved(cases, 2, R)
    rows.append((f"{n50} elements, preallocated output (the kernel alone; opbuilder: its kernel loop)", p50["ob"],
                 None, p50["np"], p50.get("tmul"), None))
    del x, y, xa, ya, cases, out50, buf

    # ---- report --------------------------------------------------------------------------------
    print()
    head = ["case", "opbuilder Function", "torch C++ Function", "ob / torch Function", "numpy.multiply",
            "torch.mul", "floor (bare pybind11)"]
    timing.table(head, [[case, us(o), us(t), ratio(o, t).fmt("x") if t else "—", us(npy), us(tm), us(fl)]
                        for case, o, t, npy, tm, fl in rows])
    print()
    over = ratio(rm["ob"], rm["floor"])
    over_rec = ratio(rm["ob_rec"], rm["floor"])
    print(f"1M elements: the floor (a bare pybind11 call: numpy allocates the output, the same kernel runs) "
          f"{rm['floor'].fmt('us')}; opbuilder call / floor {over.fmt('x', 3)} (recording grad: "
          f"{over_rec.fmt('x', 3)}); the kernel loop alone over a preallocated output {rm['kernel'].fmt('us')} "
          f"(for scale only: it skips the output's allocation and first touch, so it is no bound).")
    print()

    def goal_le(text: str, a: Stat, b: Optional[Stat] = None, limit: float = 1.0, absolute: float = 0.0) -> None:
        if b is None:
            report.goal(text, a.median <= absolute, f"{a.median * 1e6:.2f} us")
        else:
            r = ratio(a, b)
            report.goal(text, r.median <= limit, f"{r.median:.3f}x")

    goal_le("forward, no grad, 1 element <= 1.5 us", r1["ob"], absolute=1.5e-6)
    if have_torch:
        goal_le("forward, no grad, 1 element <= torch C++ Function", r1["ob"], r1["tf"])
    goal_le("forward, recording grad, 1 element <= 3 us", r2["ob"], absolute=3e-6)
    if have_torch:
        goal_le("value_and_grad, 1 element <= torch C++ Function forward+backward", r3["ob"], r3["tf"])
        goal_le("value_and_grad, 10-op chain <= torch C++ Function", r4["ob"], r4["tf"])
    goal_le("1M elements: call within 3% of the floor (same allocation and kernel)", rm["ob"], rm["floor"], 1.03)
    goal_le("50M elements, fresh output: opbuilder within 1.2x of numpy.multiply", r50["ob"], r50["np"], 1.2)
    goal_le("50M elements, preallocated output: opbuilder's kernel within 1.2x of numpy.multiply(out=)",
            p50["ob"], p50["np"], 1.2)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
