"""Call overhead of one operator bound with nanobind and with pybind11, same source, same run.

    python benchmarks/binding_call.py [--rounds 15]

The README operator (custom_src/function_ops.cpp, its OB_MODULE built once with each binding,
-O2 both) on one element: forward without grad, forward recording a node, and value_and_grad.
Cases are timed round-robin (benchmarks/timing.py interleaved), so load from other processes hurts
both alike; each figure is the median of the rounds with their min-max. Goal (issue 21): a nanobind
operator's 1-element call without grad no slower than the 0.73 us a pybind11 one took before it.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a checkout without installing
from timing import Report, header, interleaved, ratio, table  # noqa: E402  (before numpy: it pins numpy's threads)

import numpy as np  # noqa: E402

import runtime as rt  # noqa: E402
from runtime import Tensor  # noqa: E402


CALL_GOAL_US = 0.73  # a pybind11 operator's 1-element call before issue 21 (benchmarks/call_overhead.py)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args(argv)
    from opbuilder import CustomOpBuilder
    src = [str(HERE.parent / "custom_src" / "function_ops.cpp")]
    mods = {b: CustomOpBuilder(f"bench_call_{b}", src, binding=b).load() for b in ("nanobind", "pybind11")}
    x, y = Tensor(np.ones(1, np.float32) * 2), Tensor(np.ones(1, np.float32) * 3)
    xg = Tensor(np.ones(1, np.float32) * 2, requires_grad=True)
    rows = [("forward, no grad, 1 element", lambda m: (lambda: m.mul(x, y)), 20000),
            ("forward, recording grad, 1 element", lambda m: (lambda: m.mul(xg, y)), 20000),
            ("value_and_grad, 1 element",
             lambda m: (lambda f=rt.value_and_grad(lambda a, b: m.mul(a, b), grad_position=(0, 1)): f(x, y)), 2000)]
    header("binding call overhead: one operator bound with nanobind and with pybind11", args.rounds)
    report, out, forward = Report(), [], None
    for label, make, number in rows:
        st = interleaved({b: make(m) for b, m in mods.items()}, number, args.rounds)
        out.append([label, st["nanobind"].fmt(), st["pybind11"].fmt(),
                    ratio(st["nanobind"], st["pybind11"]).fmt("x")])
        forward = forward or st["nanobind"]
    table(["case", "nanobind", "pybind11", "nanobind / pybind11"], out)
    report.goal(f"nanobind operator, forward, no grad, 1 element <= {CALL_GOAL_US} us (issue 21)",
                forward.median * 1e6 <= CALL_GOAL_US, forward.fmt())
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
