"""Call overhead of one operator, against peers and floors measured in the same run.

    python benchmarks/binding_call.py [--rounds 15]

The README operator (custom_src/function_ops.cpp, its OB_MODULE built with nanobind, opbuilder's
default, and with pybind11; -O2 both) on one element: forward without grad, forward recording a
node, and value_and_grad. Beside it, on the same 1-element float32 data:

- numpy's ``np.multiply(a, b)``: the peer, a C call on arrays that allocates its result;
- a nanobind function on numpy arrays as a nanobind user writes one (benchmarks/binding_floor.cpp
  ``floor_mul``: ``nb::ndarray`` in, a new one out; built by the builder with the same flags against
  the same prebuilt libnanobind), without opbuilder's Tensor and autograd;
- ctypes with prebuilt arguments (``bench_floor_mul`` in the same library, output preallocated):
  the floor of any call from Python into C.

Cases are timed round-robin (benchmarks/timing.py interleaved), so load from other processes hurts
all alike; each figure is the median of the rounds with their min-max, each ratio the median of the
per-round ratios. Goals, each a ratio against something timed in the same rounds (issue 38: no absolute
times from another machine), each printed with the load average right after its rows were timed; for
the 1-element forward call without grad, the nanobind operator costs

- at most 2.0x numpy's ``np.multiply`` (the same work on arrays, in C);
- no more than the nanobind function on numpy arrays (opbuilder's tensors and Function machinery cost
  no more than nanobind's own ndarray conversions);
- at most 2.0x ctypes with prebuilt arguments (the floor).

The pybind11 build's column (issue 21 asked the nanobind operator to cost no more than it) is shown,
not judged: it is this project's own other build, not a peer.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a checkout without installing
from timing import Report, header, interleaved, ratio, table  # noqa: E402  (before numpy: it pins numpy's threads)

import numpy as np  # noqa: E402

import runtime as rt  # noqa: E402
from runtime import Tensor  # noqa: E402

NUMPY_GOAL = 2.0  # the nanobind operator against np.multiply
NDARRAY_GOAL = 1.0  # ... against a nanobind function on numpy arrays
CTYPES_GOAL = 2.0  # ... against ctypes with prebuilt arguments


def load_average() -> str:
    """The machine's load averages, for a goal line."""
    return "load average " + ", ".join(f"{v:.1f}" for v in os.getloadavg())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args(argv)
    from opbuilder import CustomOpBuilder
    src = [str(HERE.parent / "custom_src" / "function_ops.cpp")]
    mods = {b: CustomOpBuilder(f"bench_call_{b}", src, binding=b).load() for b in ("nanobind", "pybind11")}
    floor = CustomOpBuilder("bench_binding_floor", [str(HERE / "binding_floor.cpp")], include_paths=[str(HERE)]).load()
    cfn = ctypes.CDLL(floor.__file__).bench_floor_mul
    cfn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    cfn.restype = None
    x, y = Tensor(np.ones(1, np.float32) * 2), Tensor(np.ones(1, np.float32) * 3)
    xg = Tensor(np.ones(1, np.float32) * 2, requires_grad=True)
    a, b, o = np.full(1, 2.0, np.float32), np.full(1, 3.0, np.float32), np.empty(1, np.float32)
    pa, pb, po = (ctypes.c_void_p(v.ctypes.data) for v in (a, b, o))  # prebuilt: no conversion per call
    n1 = ctypes.c_int64(1)
    floors = {"numpy": lambda: np.multiply(a, b), "ndarray": lambda: floor.floor_mul(a, b),
              "ctypes": lambda: cfn(pa, pb, po, n1)}
    rows = [("forward, no grad, 1 element", lambda m: (lambda: m.mul(x, y)), 20000, floors),
            ("forward, recording grad, 1 element", lambda m: (lambda: m.mul(xg, y)), 20000, {}),
            ("value_and_grad, 1 element",
             lambda m: (lambda f=rt.value_and_grad(lambda p, q: m.mul(p, q), grad_position=(0, 1)): f(x, y)), 2000,
             {})]
    header("binding call overhead: one operator bound with nanobind and with pybind11, against numpy, a "
           "nanobind ndarray function and ctypes", args.rounds)
    print("flags: both operator builds and the floor module -O2 (the builder's defaults; nanobind against the "
          "prebuilt libnanobind); numpy and ctypes as installed")
    report, out, forward, load_fwd = Report(), [], None, ""
    for label, make, number, extra in rows:
        st = interleaved({**{k: make(m) for k, m in mods.items()}, **extra}, number, args.rounds)
        out.append([label, st["nanobind"].fmt(), st["pybind11"].fmt(), ratio(st["nanobind"], st["pybind11"]).fmt("x")]
                   + [st[k].fmt() if k in st else "" for k in floors]
                   + [ratio(st["nanobind"], st[k]).fmt("x") if k in st else "" for k in floors])
        if forward is None:
            forward, load_fwd = st, load_average()
    table(["case", "nanobind", "pybind11", "nanobind / pybind11", "numpy np.multiply", "nanobind ndarray function",
           "ctypes, prebuilt arguments", "nanobind / numpy", "nanobind / ndarray function", "nanobind / ctypes"], out)
    for name, key, goal in (("numpy's np.multiply", "numpy", NUMPY_GOAL),
                            ("a nanobind function on numpy arrays", "ndarray", NDARRAY_GOAL),
                            ("ctypes with prebuilt arguments", "ctypes", CTYPES_GOAL)):
        q = ratio(forward["nanobind"], forward[key])
        report.goal(f"nanobind operator, forward, no grad, 1 element <= {goal}x {name} ({load_fwd})",
                    q.median <= goal, q.fmt("x"))
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
