"""Cost of one ops.Custom aot call on 1-element tensors, next to numpy and the runtime's own ops.

    python benchmarks/aot_call.py [--number N] [--repeat R]

Builds custom_src/aot_add.cpp (the seed's CustomAdd) into a private cache
directory, then times, in this one process, R rounds of N calls of each row,
round-robin (every round times every row once, so load from other processes
hurts all rows alike), the best round counting:

  numpy np.add on the arrays            the floor: what the arithmetic costs
  runtime.ops.add on Tensors            a built-in op of the runtime
  Custom aot, fixed out_shape/out_dtype the seed's CustomAdd(out_shape=[1], out_dtype=float32)
  Custom aot, shape/dtype callables     lambda x, _: x (results remembered per input signature)
  Custom aot, with reg_info             the dtype check against a CustomRegOp row
  Custom pyfunc (np.add)                the same through a Python function
  ctypes, per-call argument setup       what calling the C ABI through ctypes costs (for contrast)

and prints microseconds per call and each figure's ratio to numpy. Goals,
from this run's numbers only: the fixed-shape aot call <= 5 us, and at most
the pyfunc call (the same add through a Python function) and the ctypes call
(the same C ABI set up per call).
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def best_us(cases: Dict[str, Callable[[], object]], number: int, rounds: int) -> Dict[str, float]:
    """Microseconds per call of each case (benchmarks/timing.py's best_of, round-robin)."""
    from timing import best_of
    return {name: t * 1e6 for name, t in best_of(cases, number, rounds).items()}


def ctypes_call(lib_path: str, a: np.ndarray, b: np.ndarray):
    """One C-ABI call set up with ctypes each time, as a naive binding would."""
    fn = ctypes.CDLL(lib_path).CustomAdd
    fn.restype = ctypes.c_int
    i64p = ctypes.POINTER(ctypes.c_int64)

    def call():
        out = np.empty_like(a)
        arrs = (a, b, out)
        params = (ctypes.c_void_p * 3)(*[x.ctypes.data for x in arrs])
        ndims = (ctypes.c_int * 3)(*[x.ndim for x in arrs])
        shapes = (i64p * 3)(*[x.ctypes.shape_as(ctypes.c_int64) for x in arrs])
        dtypes = (ctypes.c_char_p * 3)(*[x.dtype.name.encode() for x in arrs])
        if fn(3, params, ndims, shapes, dtypes, None, None) != 0:
            raise RuntimeError("CustomAdd failed")
        return out

    return call


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--number", type=int, default=20000, help="calls per round")
    ap.add_argument("--repeat", type=int, default=7, help="rounds; the best one counts")
    args = ap.parse_args()

    os.environ.setdefault("OPBUILDER_CACHE_DIR", tempfile.mkdtemp(prefix="opbuilder-bench-"))
    sys.path.insert(0, str(ROOT))
    import runtime as rt
    from runtime import Tensor, ops
    from runtime.ops import CustomRegOp, DataType

    src = ROOT / "custom_src" / "aot_add.cpp"
    t1, t2 = Tensor([1.0], rt.float32), Tensor([3.0], rt.float32)
    a, b = t1.asnumpy(), t2.asnumpy()
    fixed = ops.Custom(f"{src}:CustomAdd", out_shape=[1], out_dtype=rt.float32, func_type="aot")
    by_fn = ops.Custom(f"{src}:CustomAdd", out_shape=lambda x, _: x, out_dtype=lambda x, _: x, func_type="aot")
    info = (CustomRegOp("custom_add").input(0, "x").input(1, "y").output(0, "z")
            .dtype_format(DataType.F32_Default, DataType.F32_Default, DataType.F32_Default).get_op_info())
    checked = ops.Custom(f"{src}:CustomAdd", out_shape=[1], out_dtype=rt.float32, reg_info=info)
    pyfunc = ops.Custom(np.add, out_shape=[1], out_dtype=rt.float32, func_type="pyfunc")
    for op in (fixed, by_fn, checked, pyfunc):
        assert op(t1, t2).item() == 4.0

    rows = {
        "numpy np.add on the arrays": lambda: np.add(a, b),
        "runtime.ops.add on Tensors": lambda: rt.ops.add(t1, t2),
        "Custom aot, fixed out_shape/out_dtype": lambda: fixed(t1, t2),
        "Custom aot, shape/dtype callables": lambda: by_fn(t1, t2),
        "Custom aot, with reg_info": lambda: checked(t1, t2),
        "Custom pyfunc (np.add)": lambda: pyfunc(t1, t2),
        "ctypes, per-call argument setup": ctypes_call(fixed._kernel.library, a, b),
    }
    print(f"1-element float32 tensors; best of {args.repeat} rounds x {args.number} calls, rows interleaved")
    times = best_us(rows, args.number, args.repeat)
    base = times["numpy np.add on the arrays"]
    for name, us in times.items():
        print(f"  {name:40s} {us:8.2f} us   {us / base:6.2f}x numpy")
    aot = times["Custom aot, fixed out_shape/out_dtype"]
    goals = [
        (f"fixed-shape aot call <= 5 us ({aot:.2f} us)", aot <= 5.0),
        ("fixed-shape aot call <= the pyfunc call", aot <= times["Custom pyfunc (np.add)"]),
        ("fixed-shape aot call <= the per-call ctypes call", aot <= times["ctypes, per-call argument setup"]),
    ]
    for text, ok in goals:
        print(f"goal: {text}: {'met' if ok else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
