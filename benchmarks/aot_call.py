"""Cost of one ops.Custom aot call, on 1-element and 1M-element tensors, next to numpy, torch, ctypes and
the runtime's own ops.

    python benchmarks/aot_call.py [--number N] [--rounds R]   # about 30 s

Builds custom_src/aot_add.cpp (the seed's CustomAdd) into a private cache
directory, then times in this one process, in interleaved rounds
(benchmarks/timing.py; medians with min-max, one thread on every side):

  numpy np.add on the arrays            the floor: what the arithmetic costs
  torch.add on tensors                  PyTorch's eager op (when torch is installed)
  runtime.ops.add on Tensors            a built-in op of the runtime
  Custom aot, fixed out_shape/out_dtype the seed's CustomAdd(out_shape=[n], out_dtype=float32)
  Custom aot, shape/dtype callables     lambda x, _: x (results remembered per input signature)
  Custom aot, with reg_info             the dtype check against a CustomRegOp row
  Custom pyfunc (np.add)                the same through a Python function
  ctypes, arguments prebuilt            the same C ABI through ctypes, as a careful binding calls it:
                                        argument arrays built once, a fresh output per call

The 1M-element rows show what is left of the call when the add itself dominates.
Goals, from this run's numbers only: the fixed-shape aot call <= 0.9 us on 1
element, no slower than the pyfunc call, the ctypes call and torch.add there,
and within 1.2x of np.add and torch.add on 1M elements; the call with
shape/dtype callables within 1.3x of the fixed-shape call on 1 element.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing  # noqa: E402  (first: pins the thread count before numpy and torch load)
from timing import Report, interleaved, ratio  # noqa: E402

import numpy as np  # noqa: E402

ROOT = timing.ROOT
NUMPY, TORCH, CTYPES = "numpy np.add on the arrays", "torch.add on tensors", "ctypes, arguments prebuilt"
AOT, PYFUNC = "Custom aot, fixed out_shape/out_dtype", "Custom pyfunc (np.add)"
BY_FN = "Custom aot, shape/dtype callables"


def ctypes_call(lib_path: str, a: np.ndarray, b: np.ndarray) -> Callable[[], np.ndarray]:
    """The C-ABI call through ctypes as a careful binding makes it: argument arrays built once, no argtypes
    conversion; per call only a fresh numpy output is allocated and its address stored (the aot path must
    allocate its output too). ``ndarray.ctypes.data`` would cost ~4 us a call; c_char.from_buffer does not."""
    fn = ctypes.CDLL(lib_path).CustomAdd
    i64p = ctypes.POINTER(ctypes.c_int64)
    params = (ctypes.c_void_p * 3)(a.ctypes.data, b.ctypes.data, None)
    ndims = (ctypes.c_int * 3)(a.ndim, b.ndim, a.ndim)
    shape = (ctypes.c_int64 * a.ndim)(*a.shape)
    shapes = (i64p * 3)(*[ctypes.cast(shape, i64p)] * 3)
    dtypes = (ctypes.c_char_p * 3)(*[b"float32"] * 3)
    address, view, empty_like = ctypes.addressof, ctypes.c_char.from_buffer, np.empty_like

    def call(a: np.ndarray = a, b: np.ndarray = b) -> np.ndarray:  # a, b: their addresses stay valid
        out = empty_like(a)
        params[2] = address(view(out))
        if fn(3, params, ndims, shapes, dtypes, None, None) != 0:
            raise RuntimeError("CustomAdd failed")
        return out

    return call


def rows_for(n: int, torch) -> Dict[str, Callable[[], object]]:
    """Every contender adding two n-element float32 tensors, each checked once against numpy."""
    import runtime as rt
    from runtime import Tensor, ops
    from runtime.ops import CustomRegOp, DataType

    src = ROOT / "custom_src" / "aot_add.cpp"
    if not src.exists():
        raise timing.Unmeasured(f"missing {src}")
    rng = np.random.default_rng(n)
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    t1, t2 = Tensor(a), Tensor(b)
    fixed = ops.Custom(f"{src}:CustomAdd", out_shape=[n], out_dtype=rt.float32, func_type="aot")
    by_fn = ops.Custom(f"{src}:CustomAdd", out_shape=lambda x, _: x, out_dtype=lambda x, _: x, func_type="aot")
    info = (CustomRegOp("custom_add").input(0, "x").input(1, "y").output(0, "z")
            .dtype_format(DataType.F32_Default, DataType.F32_Default, DataType.F32_Default).get_op_info())
    checked = ops.Custom(f"{src}:CustomAdd", out_shape=[n], out_dtype=rt.float32, reg_info=info)
    pyfunc = ops.Custom(np.add, out_shape=[n], out_dtype=rt.float32, func_type="pyfunc")
    rows: Dict[str, Callable[[], object]] = {
        NUMPY: lambda: np.add(a, b),
        "runtime.ops.add on Tensors": lambda: rt.ops.add(t1, t2),
        AOT: lambda: fixed(t1, t2),
        BY_FN: lambda: by_fn(t1, t2),
        "Custom aot, with reg_info": lambda: checked(t1, t2),
        PYFUNC: lambda: pyfunc(t1, t2),
    }
    rows[CTYPES] = ctypes_call(fixed._kernel.library, a, b)
    if torch is not None:
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        rows[TORCH] = lambda: torch.add(ta, tb)
    want = a + b
    for name, fn in rows.items():
        got = fn()
        got = got.asnumpy() if hasattr(got, "asnumpy") else np.asarray(got)
        if not np.array_equal(got, want):
            raise timing.Unmeasured(f"{name} gave a wrong sum")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--number", type=int, default=10000, help="calls per round on 1 element (1M: number / 500)")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    os.environ.setdefault("OPBUILDER_CACHE_DIR", tempfile.mkdtemp(prefix="opbuilder-bench-"))
    torch = timing.load_torch()
    timing.header("ops.Custom aot call cost, float32", args.rounds, torch)
    report = Report()
    results = {}
    for n, number in ((1, args.number), (1 << 20, max(1, args.number // 500))):
        try:
            rows = rows_for(n, torch)
        except (timing.Unmeasured, OSError, RuntimeError) as e:
            report.fail(f"{n} element(s)", e)
            continue
        t = interleaved(rows, number, args.rounds)
        results[n] = t
        print(f"\n{n} element(s), {number} calls per round:")
        timing.table(["case", "per call", "case / numpy"],
                     [[name, v.fmt("us"), ratio(v, t[NUMPY]).fmt("x")] for name, v in t.items()])
    print()
    if 1 in results:
        t = results[1]
        aot = t[AOT]
        report.goal("1 element: fixed-shape aot call <= 0.9 us (issue 24)", aot.median <= 0.9e-6,
                    f"{aot.median * 1e6:.2f} us")
        by_fn = ratio(t[BY_FN], aot)
        load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
        report.goal(f"1 element: aot call with shape/dtype callables <= 1.3x the fixed-shape call (issue 38; "
                    f"load average {load})", by_fn.median <= 1.3, by_fn.fmt("x"))
        for peer in (PYFUNC, CTYPES, TORCH):
            if peer in t:
                r = ratio(aot, t[peer])
                report.goal(f"1 element: fixed-shape aot call <= {peer}", r.median <= 1.0, f"{r.median:.2f}x")
    if 1 << 20 in results:
        t = results[1 << 20]
        for peer in (NUMPY, TORCH):
            if peer in t:
                r = ratio(t[AOT], t[peer])
                report.goal(f"1M elements: fixed-shape aot call within 1.2x of {peer}", r.median <= 1.2,
                            f"{r.median:.2f}x")
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
