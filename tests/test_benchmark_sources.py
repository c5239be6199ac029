"""The benchmarks' own operators build and work (a benchmark that cannot build measures nothing)."""
from __future__ import annotations

import numpy as np
import pytest

from op_util import ROOT, load_op
from runtime import Tensor

pytestmark = pytest.mark.build  # compiles benchmarks/opbuilder_mul.cpp


def test_the_call_overhead_operator_builds_and_its_floor_multiplies():
    m = load_op("bench_mul_test", [ROOT / "benchmarks" / "opbuilder_mul.cpp"])
    x = Tensor(np.array([1.5, -2.0], np.float32))
    y = Tensor(np.array([2.0, 3.0], np.float32))
    np.testing.assert_array_equal(m.mul(x, y).asnumpy(), [3.0, -6.0])
    np.testing.assert_array_equal(m.floor_call(x, y).asnumpy(), [3.0, -6.0])  # uses pybind11/numpy.h
    with pytest.raises(ValueError, match=r"^floor_call: expected float32 tensors$"):
        m.floor_call(Tensor(np.ones(2)), y)
