"""GPU timings (issue 12's goals): a custom CUDA Function op call, a bandwidth-bound add against CuPy's,
an aot CUDA op call. Prints "no GPU" with the reason and exits 0 where no GPU is usable.

    python benchmarks/gpu.py

Timings: benchmarks/timing.py (interleaved rounds with the device synchronized around each block,
medians with min-max, ratios round by round). A failing nvcc prints FAIL and the exit status is 1.
"""
from __future__ import annotations

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


def main() -> int:
    if not rt.cuda.is_available():
        print(f"no GPU: {rt.cuda.unavailable_reason()}")
        return 0
    import cupy as cp
    from opbuilder import CustomOpBuilder
    timing.header("GPU timings", ROUNDS)
    report = Report()
    sync = rt.cuda.synchronize
    cu = HERE.parent / "tests" / "cuda" / "cuda_function_ops.cu"
    mod = CustomOpBuilder("cuda_function_ops", [str(cu)], backend="GPU").load()
    x1 = Tensor(np.ones(1), rt.float64, "GPU")
    with rt.no_grad():
        t_fn = interleaved({"fn": lambda: mod.square_plus(x1, 1.0)}, 2000, ROUNDS, sync=sync)["fn"]
    print(f"custom CUDA Function op, 1 element, no grad: {t_fn.fmt('us')} per call")
    x1.requires_grad_()
    t_fb = interleaved({"fb": lambda: rt.grad(lambda a: mod.square_plus(a, 1.0).sum())(x1)}, 500, ROUNDS,
                       sync=sync)["fb"]
    print(f"forward+backward of the custom CUDA op, 1 element: {t_fb.fmt('us')}")

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
