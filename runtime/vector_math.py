"""glibc's vector math (libmvec) for generated C++ loops: declarations, compile and link flags.

A loop calling ``expf`` stays scalar (~15 ns an element) unless the compiler
knows a vector variant exists. glibc's <math.h> declares them only under
-ffast-math, which would change NaN/inf/-0.0 results, so the generated code
declares them itself (``__attribute__((simd))``): with -fno-math-errno the
vectorizer then calls ``_ZGVdN8v_expf`` & co. Used by the jit's fused
kernels (runtime/graph) and the hybrid DSL (runtime/hybrid).
"""
from __future__ import annotations

import functools
import os
import platform
from typing import Iterable, List, Sequence

__all__ = ["UNARY", "BINARY", "available", "cpu_flags", "declarations", "cflags", "ldflags"]

# libm functions with a float and a double vector variant in glibc 2.35's libmvec (x86-64)
UNARY = ("acos", "acosh", "asin", "asinh", "atan", "atanh", "cbrt", "cos", "cosh", "erf", "erfc", "exp", "exp10",
         "exp2", "expm1", "log", "log10", "log1p", "log2", "sin", "sinh", "tan", "tanh")
BINARY = ("atan2", "hypot", "pow")
_CTYPES = {"float": "f", "double": ""}


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """Whether glibc's libmvec has vector tanh/exp/... (x86-64, glibc 2.35 or newer): loops then vectorize."""
    try:
        lib, version = os.confstr("CS_GNU_LIBC_VERSION").split()  # type: ignore[union-attr]
        major, minor = (int(v) for v in version.split(".")[:2])
    except (ValueError, OSError, AttributeError):
        return False
    return lib == "glibc" and platform.machine() == "x86_64" and (major, minor) >= (2, 35)


@functools.lru_cache(maxsize=None)
def cpu_flags() -> List[str]:
    """-mavx2 -mfma when this CPU has them (8 floats a vector; named in the flags, so part of the cache key)."""
    try:
        with open("/proc/cpuinfo") as f:
            words = set(f.read(1 << 16).split())
    except OSError:
        return []
    return ["-mavx2", "-mfma"] if {"avx2", "fma"} <= words else []


def declarations(names: Iterable[str], ctypes: Sequence[str] = ("float", "double")) -> str:
    """``extern "C"`` declarations of ``names`` (of UNARY/BINARY) for each C type, with their simd variants."""
    out = []
    for name in names:
        arity = 2 if name in BINARY else 1
        if name not in BINARY and name not in UNARY:
            raise ValueError(f"{name}: no vector variant in libmvec")
        for ct in ctypes:
            args = ", ".join([ct] * arity)
            out.append(f'extern "C" __attribute__((simd("notinbranch"))) {ct} {name}{_CTYPES[ct]}({args}) noexcept;')
    return "\n".join(out)


def cflags() -> List[str]:
    """Compile flags for loops over libm calls: no errno (calls have no side effect: if-converted and
    vectorized), ``omp simd`` pragmas honoured, the CPU's vector width. a*b+c is never contracted to an fma
    (numpy rounds twice)."""
    return ["-fno-math-errno", "-fopenmp-simd", "-ffp-contract=off"] + cpu_flags()


def ldflags() -> List[str]:
    """Link flags: libmvec where the declarations are used, and libm."""
    return ["-lmvec", "-lm"] if available() else ["-lm"]
