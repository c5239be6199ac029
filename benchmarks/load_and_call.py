"""The example operator end to end: build it, load it, call it.

    python benchmarks/load_and_call.py [--warm-runs 9] [--rounds 7]   # about 30 s after the cold build

Prints, for custom_src/function_ops.cpp's ``mul``:
  * cold build: ``load()`` in a new process on an empty cache directory
    (compiler, PCH and LTO as a first-time user gets them; one sample);
  * warm ``load()`` in a new process (median and min-max of several processes;
    the time of the ``load()`` call itself, and of the whole process);
  * per-call time on 1-element and 1M-element float32 tensors (no grad), next
    to ``numpy.multiply`` on the same arrays: interleaved rounds, medians with
    min-max, the ratio taken round by round (benchmarks/timing.py), one thread.

Goals: the warm load() <= 2 ms (the builder's goal), and the 1M-element call
within 1.1x of numpy.multiply (both allocate the output and run one loop).

A child process that fails, or a missing source, prints FAIL and the exit status is 1.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing  # noqa: E402  (first: pins the thread count before numpy and torch load)
from timing import Report, Stat, interleaved, ratio  # noqa: E402

import numpy as np  # noqa: E402

SOURCE = timing.ROOT / "custom_src" / "function_ops.cpp"

CHILD = """
import json, sys, time
import runtime
from opbuilder import CustomOpBuilder
t0 = time.perf_counter()
m = CustomOpBuilder("my_ops", [sys.argv[1]]).load()
t1 = time.perf_counter()
assert m.mul(runtime.Tensor(2.0), runtime.Tensor(3.0)).item() == 6.0
print(json.dumps({"load": t1 - t0}))
"""


def _child(cache: str) -> dict:
    env = timing.child_env(OPBUILDER_CACHE_DIR=cache)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # a real user's imports use .pyc files
    t0 = time.perf_counter()
    res = timing.run_child([sys.executable, "-c", CHILD, str(SOURCE)], env=env, what="the load() child")
    wall = time.perf_counter() - t0
    out = json.loads(res.stdout.strip().splitlines()[-1])
    out["process"] = wall
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warm-runs", type=int, default=9, help="new processes for the warm load()")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds of the per-call rows")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    report = Report()
    timing.header(f"{SOURCE.relative_to(timing.ROOT)} mul: build, load, call", args.rounds)
    if not SOURCE.exists():
        report.fail("every row", f"missing {SOURCE}")
        return report.finish()

    with tempfile.TemporaryDirectory(prefix="opbuilder-bench-") as tmp:
        cache = os.path.join(tmp, "cache")
        print("building the example operator on an empty cache ...", file=sys.stderr, flush=True)
        try:
            cold = _child(cache)
            _child(cache)  # unmeasured: writes bytecode caches
            warm = [_child(cache) for _ in range(args.warm_runs)]
        except timing.Unmeasured as e:
            report.fail("build and load rows", e)
            cold, warm = None, []

        os.environ["OPBUILDER_CACHE_DIR"] = cache
        import runtime as rt
        from opbuilder import CustomOpBuilder
        m = CustomOpBuilder("my_ops", [str(SOURCE)]).load()
        rows = []
        for n, calls in ((1, 20_000), (1 << 20, 50)):
            a = np.random.default_rng(0).standard_normal(n).astype(np.float32)
            b = np.random.default_rng(1).standard_normal(n).astype(np.float32)
            x, y = rt.Tensor(a), rt.Tensor(b)
            assert np.array_equal(m.mul(x, y).asnumpy(), a * b)
            t = interleaved({"op": lambda: m.mul(x, y), "np": lambda: np.multiply(a, b)}, calls, args.rounds)
            rows.append((n, t["op"], t["np"]))

    if cold is not None:
        print(f"cold build (empty cache, load() in a new process, one sample)  {cold['load']:8.2f} s")
        load = Stat([w["load"] for w in warm])
        whole = Stat([w["process"] for w in warm])
        print(f"warm load() in a new process ({len(warm)} processes)             {load.fmt('ms')}")
        print(f"warm: whole new process (import runtime + load)          {whole.fmt('s', 3)}")
    timing.table(["per call, float32, no grad", "custom mul", "numpy.multiply", "mul / numpy"],
                 [[f"{n} element{'s' if n > 1 else ''}", op.fmt("us"), npy.fmt("us"), ratio(op, npy).fmt("x")]
                  for n, op, npy in rows])
    print()
    if cold is not None:
        report.goal("warm load() in a new process <= 2 ms (docs/builder.md)", load.median <= 2e-3,
                    f"{load.median * 1e3:.2f} ms")
    r = ratio(rows[1][1], rows[1][2])
    report.goal("1M elements: custom mul within 1.1x of numpy.multiply (same work)", r.median <= 1.1,
                f"{r.median:.2f}x")
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
