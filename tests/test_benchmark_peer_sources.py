"""The operators and floors benchmarks/interop.py and binding_call.py time beside their peers build
and compute what the peers compute (a peer column that measures a broken build measures nothing)."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from op_util import ROOT, load_op
from runtime import Tensor

pytestmark = pytest.mark.build  # compiles benchmarks/opbuilder_mul_nb.cpp and binding_floor.cpp

BENCH = ROOT / "benchmarks"


def test_the_nanobind_build_of_the_benchmark_op_multiplies():
    m = load_op("bench_mul_nb_test", [BENCH / "opbuilder_mul_nb.cpp"])
    assert type(m.mul).__module__ == "nanobind"  # OB_MODULE: bound as a user's op is by default
    x = Tensor(np.array([1.5, -2.0], np.float32))
    y = Tensor(np.array([2.0, 3.0], np.float32))
    np.testing.assert_array_equal(m.mul(x, y).asnumpy(), [3.0, -6.0])
    with pytest.raises(ValueError, match=r"^mul: expected two float32 tensors of one shape$"):
        m.mul(Tensor(np.ones(2)), y)


def test_the_binding_floors_multiply():
    m = load_op("bench_binding_floor_test", [BENCH / "binding_floor.cpp"], include_paths=[str(BENCH)])
    a, b = np.array([1.5, -2.0], np.float32), np.array([2.0, 3.0], np.float32)
    np.testing.assert_array_equal(m.floor_mul(a, b), [3.0, -6.0])
    with pytest.raises(ValueError, match=r"^floor_mul: expected two arrays of one size$"):
        m.floor_mul(a, np.ones(3, np.float32))
    fn = ctypes.CDLL(m.__file__).bench_floor_mul  # the ctypes floor, exported from the same library
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    fn.restype = None
    out = np.zeros(2, np.float32)
    fn(a.ctypes.data, b.ctypes.data, out.ctypes.data, 2)
    np.testing.assert_array_equal(out, [3.0, -6.0])
