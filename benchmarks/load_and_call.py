"""The example operator end to end: build it, load it, call it.

    python benchmarks/load_and_call.py [--warm-runs 9]

Prints, for custom_src/function_ops.cpp's ``mul``:
  * cold build: ``load()`` in a new process on an empty cache directory
    (compiler, PCH and LTO as a first-time user gets them);
  * warm ``load()`` in a new process (median of several processes; the time of
    the ``load()`` call itself, and of the whole process);
  * per-call time on 1-element and 1M-element float32 tensors (no grad), next
    to ``numpy.multiply`` on the same arrays (best of several rounds).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "custom_src" / "function_ops.cpp"

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
    env = dict(os.environ, OPBUILDER_CACHE_DIR=cache)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # a real user's imports use .pyc files
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", CHILD, str(SOURCE)], capture_output=True, text=True, env=env,
                         timeout=1800)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"child failed:\n{res.stderr[-3000:]}")
    out = json.loads(res.stdout.strip().splitlines()[-1])
    out["process"] = wall
    return out


def _best(fn, calls: int, rounds: int) -> float:
    for _ in range(min(calls, 1000)):
        fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:10.2f} us"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warm-runs", type=int, default=9, help="new processes for the warm load() (median)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="opbuilder-bench-") as tmp:
        cache = os.path.join(tmp, "cache")
        print("building the example operator on an empty cache ...", file=sys.stderr, flush=True)
        cold = _child(cache)
        _child(cache)  # unmeasured: writes bytecode caches
        warm = [_child(cache) for _ in range(args.warm_runs)]

        os.environ["OPBUILDER_CACHE_DIR"] = cache
        import runtime as rt
        from opbuilder import CustomOpBuilder
        m = CustomOpBuilder("my_ops", [str(SOURCE)]).load()
        rows = []
        for n, calls in ((1, 200_000), (1 << 20, 200)):
            a = np.random.default_rng(0).standard_normal(n).astype(np.float32)
            b = np.random.default_rng(1).standard_normal(n).astype(np.float32)
            x, y = rt.Tensor(a), rt.Tensor(b)
            assert np.array_equal(m.mul(x, y).asnumpy(), a * b)
            t_np = t_op = float("inf")
            for _ in range(3):  # alternate, so both see the same machine
                t_np = min(t_np, _best(lambda: np.multiply(a, b), calls, 5))
                t_op = min(t_op, _best(lambda: m.mul(x, y), calls, 5))
            rows.append((n, t_op, t_np))

    print(f"custom_src/function_ops.cpp mul; Python {sys.version.split()[0]}, numpy {np.__version__}, "
          f"{os.cpu_count()} cpus")
    print(f"cold build (empty cache, load() in a new process)   {cold['load']:8.2f} s")
    print(f"warm load() in a new process (median of {len(warm)})        "
          f"{statistics.median(w['load'] for w in warm) * 1e3:8.2f} ms")
    print(f"warm: whole new process (import runtime + load)      "
          f"{statistics.median(w['process'] for w in warm):8.2f} s")
    print("per call, float32, no grad:          custom mul    numpy.multiply   ratio")
    for n, t_op, t_np in rows:
        print(f"  {n:>9} element{'s' if n > 1 else ' '}               {_us(t_op)}   {_us(t_np)}   {t_op / t_np:5.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
