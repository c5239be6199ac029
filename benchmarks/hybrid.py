"""Hybrid DSL kernels compiled by runtime.hybrid, against numpy and against the Python target; build times.

    python benchmarks/hybrid.py        # about a minute (builds in a fresh temporary cache)

Rows, all measured in this one run:
- square (y[i] = x[i] * x[i]) on 4M float32: ops.Custom of the kernel vs numpy ``x * x`` (goal: within
  1.3x), and vs the Python target (goal: at least 100x faster; the Python target is timed on 20k elements
  and scaled per element, since 4M would take minutes).
- matmul 256x256x256 float32 written as loops: i-j-k with a scalar accumulator (a dot product per element:
  the inner loop is a reduction, which gcc does not vectorize without -ffast-math), and i-k-j with the
  inner loop over j under ``vectorize`` (contiguous rows of b and c: SIMD), vs numpy's BLAS ``a @ b``.
- a loop with a run-time check: ``y[i] = x[i] * i`` on 4M int32 (numpy raises OverflowError once the Python
  int ``i`` is out of int32's range, so each iteration checks it) vs numpy ``x * arange``: what a check costs.
- warm call overhead: ops.Custom of a kernel that reads module constants, on 8 float32 elements (what a call
  costs besides its loop: specs, the constants' freshness check, the aot call).
- cold build of a small kernel (goal: at most 1.5 s) and a new process with the cache warm: its first call's
  time and how many compiler processes it ran (goal: none), counted with a logging CXX wrapper.

Timings are the best of several rounds, round-robin, so load from other processes hurts every case alike.
"""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
from timing import best_of  # noqa: E402  (benchmarks/timing.py)

from runtime import Tensor, ops  # noqa: E402
from runtime.hybrid import kernel  # noqa: E402


@kernel
def square(x):
    y = output_tensor(x.shape, x.dtype)
    for i in vectorize(x.shape[0]):
        y[i] = x[i] * x[i]
    return y


@kernel
def matmul_ijk(a, b):
    c = output_tensor((a.shape[0], b.shape[1]), a.dtype)
    for i in range(a.shape[0]):
        for j in range(b.shape[1]):
            acc = 0.0
            for k in reduce(a.shape[1]):
                acc = acc + a[i, k] * b[k, j]
            c[i, j] = acc
    return c


@kernel
def matmul_ikj(a, b):
    c = output_tensor((a.shape[0], b.shape[1]), a.dtype)
    for i in range(a.shape[0]):
        for j in vectorize(b.shape[1]):
            c[i, j] = 0.0
        for k in range(a.shape[1]):
            aik = a[i, k]
            for j in vectorize(b.shape[1]):
                c[i, j] = c[i, j] + aik * b[k, j]
    return c


@kernel
def small(x, y):
    z = output_tensor(x.shape, x.dtype)
    for i in range(x.shape[0]):
        z[i] = sqrt(abs(x[i])) + y[i] if x[i] > 0 else exp(y[i])
    return z


@kernel
def times_index(x):
    y = output_tensor(x.shape, x.dtype)
    for i in vectorize(x.shape[0]):
        y[i] = x[i] * i
    return y


SCALE = 2.0  # module constants: each call checks they still have the values the kernel was built with
OFFSET = 1


@kernel
def scaled(x):
    y = output_tensor(x.shape, x.dtype)
    for i in range(x.shape[0]):
        y[i] = x[i] * SCALE + OFFSET
    return y


def call_rows() -> None:
    op = ops.Custom(scaled)
    t = Tensor(np.ones(8, np.float32))
    np.testing.assert_array_equal(op(t).asnumpy(), np.full(8, 3.0, np.float32))
    r = best_of({"call": lambda: op(t)}, number=2000, rounds=7)
    print(f"warm call, 8 float32, kernel reading 2 module constants: {r['call'] * 1e6:6.1f} us per call")


def square_rows() -> None:
    x = np.random.default_rng(0).standard_normal(4 << 20).astype(np.float32)
    op = ops.Custom(square)
    t = Tensor(x)
    np.testing.assert_array_equal(op(t).asnumpy(), x * x)
    r = best_of({"hybrid": lambda: op(t), "numpy": lambda: x * x}, number=20, rounds=7)
    small_x = x[:20000]
    py = best_of({"python": lambda: square(small_x)}, number=1, rounds=3)["python"] * (x.size / small_x.size)
    print(f"square, 4M float32:  hybrid {r['hybrid'] * 1e3:7.2f} ms   numpy x*x {r['numpy'] * 1e3:7.2f} ms   "
          f"ratio {r['hybrid'] / r['numpy']:.2f}x (goal <= 1.3x)")
    print(f"                     python target {py:7.2f} s (scaled from 20k elements): hybrid is "
          f"{py / r['hybrid']:,.0f}x faster (goal >= 100x)")


def checked_rows() -> None:
    x = np.random.default_rng(2).integers(-100, 100, 4 << 20).astype(np.int32)
    idx = np.arange(x.size, dtype=np.int32)
    op = ops.Custom(times_index)
    t = Tensor(x)
    np.testing.assert_array_equal(op(t).asnumpy(), x * idx)
    r = best_of({"hybrid": lambda: op(t), "numpy": lambda: x * idx}, number=20, rounds=7)
    print(f"x[i] * i, 4M int32, i checked against int32's range:  hybrid {r['hybrid'] * 1e3:7.2f} ms   "
          f"numpy x*arange {r['numpy'] * 1e3:7.2f} ms   ratio {r['hybrid'] / r['numpy']:.2f}x")


def matmul_rows() -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((256, 256)).astype(np.float32)
    b = rng.standard_normal((256, 256)).astype(np.float32)
    ijk, ikj = ops.Custom(matmul_ijk), ops.Custom(matmul_ikj)
    ta, tb = Tensor(a), Tensor(b)
    for op in (ijk, ikj):
        np.testing.assert_allclose(op(ta, tb).asnumpy(), a @ b, rtol=1e-3, atol=1e-3)
    r = best_of({"ijk": lambda: ijk(ta, tb), "ikj": lambda: ikj(ta, tb), "blas": lambda: a @ b},
                number=3, rounds=5)
    for k, label in (("ijk", "i-j-k, scalar accumulator"), ("ikj", "i-k-j, vectorize over j")):
        print(f"matmul 256^3 float32, {label:26s} {r[k] * 1e3:7.2f} ms   {r[k] / r['blas']:6.1f}x numpy's BLAS "
              f"({r['blas'] * 1e3:.2f} ms)")
    print(f"                      loop order i-k-j is {r['ijk'] / r['ikj']:.1f}x faster than i-j-k")


def build_rows() -> None:
    sig = (("float32", 1), ("float32", 1))
    ops.Custom(small)  # the aot call path, built once per cache: not part of the kernel's build
    t0 = time.perf_counter()
    small.compiled(sig)
    cold = time.perf_counter() - t0
    print(f"cold build of a small kernel: {cold:.2f} s (goal <= 1.5 s)")
    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "cxx.log"
        wrapper = Path(d) / "cxx.sh"
        real = subprocess.run(["sh", "-c", "command -v c++ || command -v g++"], capture_output=True,
                              text=True).stdout.strip()
        wrapper.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$*\" >> '{log}'\nexec '{real}' \"$@\"\n")
        wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
        from opbuilder.probe_cache import SETTLE_NS
        time.sleep(SETTLE_NS / 1e9 + 0.05)  # a compiler file changed just now is probed anew by each process
        code = ("import sys, time, numpy as np; sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[2]);"
                "t0 = time.perf_counter(); from runtime import Tensor, ops; import hybrid as h;"
                "ops.Custom(h.small)(Tensor(np.ones(7, np.float32)), Tensor(np.ones(7, np.float32)));"
                "print(time.perf_counter() - t0)")
        env = dict(os.environ, CXX=str(wrapper))  # a compiler that logs (the compiler is part of the key)
        subprocess.run([sys.executable, "-c", code, str(ROOT), str(HERE)], env=env, check=True, capture_output=True)
        log.unlink()  # the first process built what it needed; a warm one should never call the compiler
        out = subprocess.run([sys.executable, "-c", code, str(ROOT), str(HERE)], env=env, check=True,
                             capture_output=True, text=True).stdout
        runs = len(log.read_text().splitlines()) if log.exists() else 0
        print(f"new process, warm cache: import + first call {float(out) * 1e3:.0f} ms, compiler processes run: "
              f"{runs} (goal: 0)")


if __name__ == "__main__":
    os.environ["OPBUILDER_CACHE_DIR"] = tempfile.mkdtemp(prefix="hybrid-bench-")  # cold builds are cold
    call_rows()
    if "--calls" in sys.argv:  # the call-overhead row alone
        sys.exit(0)
    square_rows()
    checked_rows()
    matmul_rows()
    build_rows()
