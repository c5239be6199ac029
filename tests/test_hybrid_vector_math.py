"""Hybrid loops over libm functions run on glibc's vector math (libmvec) and keep numpy's answers.

A ``vectorize`` loop calling exp, log1p, tanh ... is compiled with the vector variants declared
(runtime/vector_math.py), so the built library calls ``_ZGVdN8v_expf`` & co. These tests check that it
does (the symbols it imports), and that over long arrays (the vector body runs, not only the scalar
remainder) the compiled target agrees with the Python target as the differential test asks: NaN where
it gives NaN, the same infinities and signs (-0.0 too), finite values within 4 ulp.
"""
from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess

import numpy as np
import pytest

from runtime import Tensor, ops, vector_math
from runtime.hybrid import kernel

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)

UNARY = ["exp", "expm1", "exp2", "log", "log1p", "log2", "log10", "sin", "cos", "tan", "asin", "acos", "atan",
         "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf"]
ULP = 4  # as test_hybrid_differential.py allows the float math functions
N = 512

SOURCE = """from runtime.hybrid import kernel


@kernel
def unary_all(x):
{outs}
    for i in vectorize(x.shape[0]):
{body}
    return {names}


@kernel
def softplus(x):
    y = output_tensor(x.shape, x.dtype)
    for i in vectorize(x.shape[0]):
        y[i] = x[i] if x[i] > 20.0 else log1p(exp(x[i]))
    return y


@kernel
def two_args(x, z):
    a = output_tensor(x.shape, x.dtype)
    p = output_tensor(x.shape, x.dtype)
    for i in vectorize(x.shape[0]):
        a[i] = atan2(x[i], z[i])
        p[i] = power(z[i], x[i])
    return a, p
"""


@pytest.fixture(scope="module")
def mod(tmp_path_factory):
    path = tmp_path_factory.mktemp("vector_math") / "vm_kernels.py"
    path.write_text(SOURCE.format(outs="\n".join(f"    o_{f} = output_tensor(x.shape, x.dtype)" for f in UNARY),
                                  body="\n".join(f"        o_{f}[i] = {f}(x[i])" for f in UNARY),
                                  names=", ".join(f"o_{f}" for f in UNARY)))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def special(dtype: str) -> np.ndarray:
    """Special values, then values across the functions' domains, N in all (the vector body runs)."""
    big = {"float32": 3e38, "float64": 1e300}[dtype]
    tiny = {"float32": 1e-45, "float64": 5e-324}[dtype]
    v = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 0.999, -0.999, 1.0001, 2.5, -2.5, 7.0, 20.0, 20.5, 88.7, 89.0, -103.0,
         -746.0, 710.0, big, -big, tiny, -tiny, 1e-30, -1e-30, np.nan, -np.nan, np.inf, -np.inf, 1e6, -1e6]
    rng = np.random.default_rng(0)
    rest = np.concatenate([rng.uniform(-1, 1, 160), rng.uniform(-30, 30, 160), rng.standard_normal(N)])
    return np.concatenate([np.array(v), rest])[:N].astype(dtype)


def disagreements(name: str, got: np.ndarray, want: np.ndarray, exact: np.ndarray) -> list:
    """Where the compiled result ``got`` is not the Python target's ``want`` (NaN, infinities, signs) or
    is more than ULP from ``exact`` (the Python target in float64, rounded: libmvec and numpy are each
    within a few ulp of the exact result, on either side of it)."""
    assert got.dtype == want.dtype == exact.dtype and got.shape == want.shape
    nan_g, nan_w = np.isnan(got), np.isnan(want)
    bits = {4: np.int32, 8: np.int64}[got.dtype.itemsize]
    same = (got.view(bits) == want.view(bits)) | (nan_g & nan_w)
    ok = np.isfinite(got) & np.isfinite(want) & (np.signbit(got) == np.signbit(want)) & np.isfinite(exact)
    g, e = got.view(bits).astype(np.int64), exact.view(bits).astype(np.int64)
    g = np.where(g < 0, np.iinfo(bits).min - g, g)  # a monotonic integer line through -0.0/0.0
    e = np.where(e < 0, np.iinfo(bits).min - e, e)
    same |= ok & (np.abs(g - e) <= ULP)
    return [f"{name}: at {i} of {got[i]!r}: C++ {got[i]!r} python {want[i]!r} exact {exact[i]!r}"
            for i in np.flatnonzero(~same)[:4]]


def imported_symbols(library: str) -> str:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm (binutils) to list the library's symbols")
    return subprocess.run([nm, "-D", "--undefined-only", library], capture_output=True, text=True,
                          check=True).stdout


@pytest.mark.skipif(not vector_math.available(), reason="no libmvec (glibc >= 2.35 on x86-64)")
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_vectorize_loop_calls_the_vector_variants(mod, dtype):
    suffix = "f" if dtype == "float32" else ""
    for k, names in ((mod.softplus, ["exp", "log1p"]), (mod.unary_all, ["exp", "log", "tanh", "sin", "erf"]),
                     (mod.two_args, ["atan2", "pow"])):
        sig = tuple((dtype, 1) for _ in range(2 if k is mod.two_args else 1))
        syms = imported_symbols(k.compiled(sig).library)
        for f in names:  # e.g. _ZGVdN8v_expf@GLIBC_2.22: AVX2, 8 lanes, one vector argument
            assert re.search(rf"\b_ZGV[bcde]N\d+v+_{f}{suffix}@", syms), f"{k.__name__}: no vector {f}{suffix}\n{syms}"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_vectorized_math_agrees_with_the_python_target(mod, dtype):
    x = special(dtype)
    z = np.roll(x, 7)
    problems = []
    for k, args, names in ((mod.unary_all, (x,), UNARY), (mod.softplus, (x,), ["softplus"]),
                           (mod.two_args, (x, z), ["atan2", "power"])):
        got = ops.Custom(k)(*[Tensor(a) for a in args])
        py = kernel(k.func, target="python")
        want = py(*args)
        exact = py(*[a.astype(np.float64) for a in args])
        got, want, exact = [r if isinstance(r, tuple) else (r,) for r in (got, want, exact)]
        for f, g, w, e in zip(names, got, want, exact):
            problems += disagreements(f"{f}({dtype})", g.asnumpy(), np.asarray(w),
                                      np.asarray(e).astype(dtype))
    assert not problems, "\n".join(problems)
