"""The (dtype name, rank) signature a hybrid op's call picks its build by (runtime.hybrid.kernel.signature_of)."""
import pickle

import numpy as np

from runtime import Tensor, ops
from runtime.hybrid import kernel
from runtime.hybrid.kernel import signature_of
import pytest

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)


def test_each_dtype_is_named_as_numpy_names_it():
    # the names come from a table looked up by the dtype: a dtype equal to a builtin one but another object
    # (unpickled, with metadata) must get the same name, and one the table lacks its own
    same = [pickle.loads(pickle.dumps(np.dtype("float32"))), np.dtype("float32", metadata={"unit": "m"}),
            np.dtype("=i8"), np.dtype("q"), np.dtype("l")]
    assert same[0] is not np.dtype("float32") and same[1] is not np.dtype("float32")
    assert np.empty(1, same[0]).dtype is same[0]  # an array keeps the dtype object it was made with
    others = [np.dtype(">f4"), np.dtype(">i2"), np.dtype("U3"), np.dtype([("a", "f4")]), np.dtype("M8[s]"),
              np.dtype("O"), np.dtype("c16")]
    for d in [np.dtype(c) for c in np.typecodes["All"]] + same + others:
        a, b = np.empty((2, 3), d), np.empty(4, d)  # an unsized one (U, S) gets a size here
        assert signature_of([a, b]) == ((a.dtype.name, 2), (b.dtype.name, 1)), d


def double(x):
    y = output_tensor(x.shape, x.dtype)
    for i in range(x.shape[0]):
        y[i] = x[i] * 2
    return y


def test_an_input_with_a_dtype_equal_to_a_builtin_one_uses_its_build():
    op = ops.Custom(kernel(double))
    x = np.array([1.5, -2.0], np.float32)
    np.testing.assert_array_equal(op(Tensor(x)).asnumpy(), [3.0, -4.0])
    y = x.astype(pickle.loads(pickle.dumps(np.dtype("float32"))))
    np.testing.assert_array_equal(op(y).asnumpy(), [3.0, -4.0])
    assert len(op._hybrid._built) == 1
