"""GPU timings (issue 25's goals): a custom CUDA Function op call against the same op as a PyTorch C++
extension (torch.autograd.Function, built by cpp_extension.load), a bandwidth-bound add against CuPy's,
an aot CUDA op call. Prints "no GPU" with the reason and exits 0 where no GPU is usable; the torch
column is skipped, saying so, without a CUDA build of torch.

    python benchmarks/gpu.py
    python benchmarks/gpu.py --build-torch-only   # build the torch reference and exit (a warm-up)

Timings: benchmarks/timing.py (interleaved rounds with the device synchronized around each block,
medians with min-max, ratios round by round). A failing nvcc prints FAIL and the exit status is 1.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing  # noqa: E402  (first: pins the host thread count before numpy loads)
from timing import Report, interleaved, ratio  # noqa: E402

import numpy as np  # noqa: E402

import runtime as rt  # noqa: E402
from runtime import Tensor, ops  # noqa: E402

HERE = timing.HERE
ROUNDS = 7


def torch_reference(torch):
    """The torch C++ extension of the same op (benchmarks/torch_cuda_square_plus.cu), or None after a line
    saying why its column is skipped (no torch, a CPU-only torch)."""
    if torch is None:
        return None
    if not torch.cuda.is_available():
        print(f"torch {torch.__version__} sees no GPU: the torch column is skipped")
        return None
    from torch.utils.cpp_extension import load
    return load("bench_torch_cuda_square_plus", [str(HERE / "torch_cuda_square_plus.cu")],
                extra_cflags=["-O2"], extra_cuda_cflags=["-O2"],
                extra_include_paths=[str(HERE.parent / "tests" / "cuda")], verbose=False)


def breakdown(mod, x, sync) -> None:
    """Where a no-grad Function op call on a runtime tensor spends its time: the Python steps its C++
    side calls (runtime/device_memory.py), each timed alone beside the whole call. Not goals."""
    from runtime import device_memory as dm
    block, ptr = dm.allocate(8, 0, False)  # device 0: where main() puts x
    arr = x._data
    steps = {"the whole call": lambda: mod.square_plus(x, 1.0),
             "allocate (CuPy's pool)": lambda: dm.allocate(8, 0, False),
             "describe (an input)": lambda: dm.describe(arr),
             "wrap (an output)": lambda: dm.wrap(ptr, 8, (1,), arr.dtype, 0, block),
             "current_stream_ptr": dm.current_stream_ptr,
             "runtime.Tensor over a CuPy array": lambda: Tensor(arr)}
    with rt.no_grad():
        t = interleaved(steps, 2000, ROUNDS, sync=sync)
    print("where a no-grad call's time goes (each step alone; not goals):")
    for name, stat in t.items():
        print(f"  {name}: {stat.fmt('us')}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-torch-only", action="store_true", help="build the torch reference, then exit")
    args = ap.parse_args(argv)
    if not rt.cuda.is_available():
        print(f"no GPU: {rt.cuda.unavailable_reason()}")
        return 0
    if args.build_torch_only:
        return 0 if torch_reference(timing.load_torch()) is not None else 1
    import cupy as cp
    from opbuilder import CustomOpBuilder
    torch = timing.load_torch()
    timing.header("GPU timings", ROUNDS, torch)
    report = Report()
    sync = rt.cuda.synchronize
    cu = HERE.parent / "tests" / "cuda" / "cuda_function_ops.cu"
    mod = CustomOpBuilder("cuda_function_ops", [str(cu)], backend="GPU").load()
    try:
        tmod = torch_reference(torch)
    except Exception as e:  # a failed nvcc/ninja build of the reference: its rows are not measured
        report.fail("torch C++ extension column", f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
        tmod = None
    x1 = Tensor(np.ones(1), rt.float64, "GPU")
    fwd = {"opbuilder": lambda: mod.square_plus(x1, 1.0)}
    wrapped = None
    if tmod is not None:
        import opbuilder
        from opbuilder.bridges import torch_bridge
        wrapped = opbuilder.to_torch(mod, backend="GPU")  # torch CUDA tensors through the C++ bridge
        torch_bridge.ready(wait=True)
        print(f"to_torch's C++ bridge: {torch_bridge.status()}")
        tx1 = torch.ones(1, dtype=torch.float64, device="cuda")
        fwd["torch"] = lambda: tmod.square_plus(tx1, 1.0)
        wrapped.square_plus(tx1, 1.0)  # the signature's first call registers its operator
        fwd["to_torch"] = lambda: wrapped.square_plus(tx1, 1.0)
    with rt.no_grad():
        t_fn = interleaved(fwd, 2000, ROUNDS, sync=sync)
    x1.requires_grad_()
    fb = {"opbuilder": lambda: rt.grad(lambda a: mod.square_plus(a, 1.0).sum())(x1)}
    if tmod is not None:
        gx1 = tx1.clone().requires_grad_(True)
        fb["torch"] = lambda: torch.autograd.grad(tmod.square_plus(gx1, 1.0).sum(), gx1)
        fb["to_torch"] = lambda: torch.autograd.grad(wrapped.square_plus(gx1, 1.0).sum(), gx1)
    t_fb = interleaved(fb, 500, ROUNDS, sync=sync)
    for label, t in (("1 element, no grad", t_fn), ("1 element, forward+backward", t_fb)):
        line = f"custom CUDA Function op, {label}: opbuilder {t['opbuilder'].fmt('us')}"
        if "torch" in t:
            r = ratio(t["opbuilder"], t["torch"])
            print(f"{line}, torch C++ extension {t['torch'].fmt('us')} ({r.fmt('x')})")
            report.goal(f"custom CUDA Function op, {label}: <= torch's C++ extension op", r.median <= 1.0,
                        f"{r.median:.2f}x")
            w = ratio(t["to_torch"], t["torch"])
            print(f"the same op through to_torch on torch CUDA tensors, {label}: {t['to_torch'].fmt('us')} "
                  f"({w.fmt('x')} torch's)")
            report.goal(f"to_torch'd CUDA Function op on torch tensors, {label}: <= 1.5x torch's C++ extension op",
                        w.median <= 1.5, f"{w.median:.2f}x")
        else:
            print(line)
    breakdown(mod, x1.detach(), sync)

    n = 64 << 20
    a, b = cp.ones(n, cp.float32), cp.ones(n, cp.float32)
    ta, tb = Tensor(a), Tensor(b)
    cases = {"cupy": lambda: a + b, "runtime": lambda: ta + tb}
    title = "64M float32 add as a custom aot CUDA op"
    with tempfile.TemporaryDirectory() as d:
        so = Path(d) / "custom_add.so"
        try:
            timing.run_child([shutil.which("nvcc") or "nvcc", "--shared", "-Xcompiler", "-fPIC", "-o", str(so),
                              str(HERE.parent / "tests" / "cuda" / "seed004_custom_add.cu")], what="nvcc")
        except timing.Unmeasured as e:
            report.fail(title, e)
            so = None
        if so is not None:
            add = ops.Custom(f"{so}:CustomAdd", out_shape=[1], out_dtype=rt.float32, func_type="aot")
            u = Tensor(np.ones(1, np.float32), device="GPU")
            t_aot = interleaved({"aot": lambda: add(u, u)}, 2000, ROUNDS, sync=sync)["aot"]
            add64 = ops.Custom(f"{so}:CustomAdd", out_shape=[n], out_dtype=rt.float32, func_type="aot")
            cases["aot"] = lambda: add64(ta, tb)
        t = interleaved(cases, 20, ROUNDS, sync=sync)
    speed = ratio(t["cupy"], t["runtime"])
    print(f"64M float32 add: runtime {t['runtime'].fmt('us', 0)}, CuPy a + b {t['cupy'].fmt('us', 0)} "
          f"(runtime at {speed.fmt('x')} of CuPy's speed)")
    if "aot" in t:
        aot_speed = ratio(t["cupy"], t["aot"])
        print(f"{title}: {t['aot'].fmt('us', 0)} ({aot_speed.fmt('x')} of CuPy's speed)")
        print(f"aot CUDA op (seed 004's CustomAdd), 1 element: {t_aot.fmt('us')} per call")
        report.goal(f"{title}: at least 0.9x of CuPy's speed", aot_speed.median >= 0.9, f"{aot_speed.median:.2f}x")
        report.goal("aot CUDA op, 1 element: <= 5 us per call", t_aot.median <= 5e-6,
                    f"{t_aot.median * 1e6:.2f} us")
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
