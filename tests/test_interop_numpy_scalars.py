"""Both bridges take a numpy scalar as the Python value it holds (issue 33: to_jax and to_torch
refused np.int64 as a static argument while np.float64, a float subclass, passed)."""
from __future__ import annotations

import math
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")

import opbuilder  # noqa: E402


def _tag(x, s):
    """The static value as the operator sees it: 1 bool, 2 int, 3 float (negative for -0.0), times |s|."""
    v = s[0] if isinstance(s, list) else s
    kind = {bool: 1.0, int: 2.0, float: 3.0}[type(v)]
    return x * 0 + (kind * math.copysign(1.0, v) if type(v) is float else kind) * (abs(v) or 1)


_CASES = [(np.int64(2), 4.0), (np.int32(3), 6.0), (np.uint8(5), 10.0), (np.bool_(True), 1.0),
          (np.float64(-0.0), -3.0), (np.float64(0.0), 3.0), (np.float32(0.5), 1.5), (2, 4.0),
          ([np.int64(2)], 4.0), ([np.float64(-0.0)], -3.0)]


def test_to_torch_takes_numpy_scalars_as_python_values():
    t = opbuilder.to_torch(types.SimpleNamespace(tag=_tag))
    x = torch.zeros(2, dtype=torch.float64)
    for s, want in _CASES + _CASES[::-1]:
        np.testing.assert_array_equal(np.asarray(t.tag(x, s)), np.full(2, want), err_msg=repr(s))
    with pytest.raises(TypeError, match=r"^tag: argument 1 is a complex128; a torch operator takes tensors, "
                                        r"None, ints, floats, bools, strings and lists of tensors, ints or floats$"):
        t.tag(x, np.complex128(1))
