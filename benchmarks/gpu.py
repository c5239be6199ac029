"""GPU timings (issue 12's goals): a custom CUDA Function op call, a bandwidth-bound add against CuPy's,
an aot CUDA op call. Prints "no GPU" with the reason and exits 0 where no GPU is usable.

    python benchmarks/gpu.py
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import timeit
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import runtime as rt  # noqa: E402
from runtime import Tensor, ops  # noqa: E402


def per_call_us(fn, sync, number: int, rounds: int = 5) -> float:
    """Best round's mean per call, in microseconds, with the device synchronized around each round."""
    best = float("inf")
    for _ in range(rounds):
        sync()
        t = timeit.timeit(lambda: fn(), number=number)
        sync()
        best = min(best, t / number * 1e6)
    return best


def main() -> int:
    if not rt.cuda.is_available():
        print(f"no GPU: {rt.cuda.unavailable_reason()}")
        return 0
    import cupy as cp
    from opbuilder import CustomOpBuilder
    sync = rt.cuda.synchronize
    cu = HERE.parent / "tests" / "cuda" / "cuda_function_ops.cu"
    mod = CustomOpBuilder("cuda_function_ops", [str(cu)], backend="GPU").load()
    x1 = Tensor(np.ones(1), rt.float64, "GPU")
    with rt.no_grad():
        t_fn = per_call_us(lambda: mod.square_plus(x1, 1.0), sync, 2000)
    print(f"custom CUDA Function op, 1 element, no grad: {t_fn:.2f} us per call")
    x1.requires_grad_()
    t_fb = per_call_us(lambda: rt.grad(lambda a: mod.square_plus(a, 1.0).sum())(x1), sync, 500)
    print(f"forward+backward of the custom CUDA op, 1 element: {t_fb:.2f} us")

    n = 64 << 20
    a, b = cp.ones(n, cp.float32), cp.ones(n, cp.float32)
    ta, tb = Tensor(a), Tensor(b)
    t_cupy = per_call_us(lambda: a + b, sync, 20)
    t_rt = per_call_us(lambda: ta + tb, sync, 20)
    print(f"64M float32 add: runtime {t_rt:.0f} us, CuPy a + b {t_cupy:.0f} us ({t_cupy / t_rt:.0%} of CuPy's speed)")

    with tempfile.TemporaryDirectory() as d:
        so = Path(d) / "custom_add.so"
        subprocess.run([shutil.which("nvcc") or "nvcc", "--shared", "-Xcompiler", "-fPIC", "-o", str(so),
                        str(HERE.parent / "tests" / "cuda" / "seed004_custom_add.cu")], check=True)
        add = ops.Custom(f"{so}:CustomAdd", out_shape=[1], out_dtype=rt.float32, func_type="aot")
        u = Tensor(np.ones(1, np.float32), device="GPU")
        t_aot = per_call_us(lambda: add(u, u), sync, 2000)
        add64 = ops.Custom(f"{so}:CustomAdd", out_shape=[n], out_dtype=rt.float32, func_type="aot")
        t_add64 = per_call_us(lambda: add64(ta, tb), sync, 20)
    print(f"64M float32 add as a custom aot CUDA op: {t_add64:.0f} us ({t_cupy / t_add64:.0%} of CuPy's speed; "
          f"goal: at least 90%)")
    print(f"aot CUDA op (seed 004's CustomAdd), 1 element: {t_aot:.2f} us per call (goal: at most 5 us)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
