"""to_jax of a bound function that returns no tensor (a number, a string, nothing): a named TypeError on
every route, where it was an internal "'float' object has no attribute 'shape'" (attack on issue 33)."""
from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax is not installed (pip install 'opbuilder[jax]')")
jnp = pytest.importorskip("jax.numpy")

import opbuilder  # noqa: E402

pytestmark = pytest.mark.build

_SRC = """
#include "opbuilder/extension.h"
using opbuilder::TensorPtr;
double norm2(const TensorPtr &x) { return static_cast<double>(x->numel()); }
std::string name(const TensorPtr &x) { return "n" + std::to_string(x->numel()); }
void nothing(const TensorPtr &) {}
"""


@pytest.fixture(scope="module")
def plain(cache_dir):
    return opbuilder.load_inline("jax_plain_returns", _SRC, functions=["norm2", "name", "nothing"])


@pytest.mark.parametrize("fn, kind", [("norm2", "float"), ("name", "str"), ("nothing", "NoneType")])
@pytest.mark.parametrize("ffi", [True, False])
def test_a_function_returning_no_tensor_is_a_named_error(plain, fn, kind, ffi):
    j = opbuilder.to_jax(plain, ffi=ffi)
    x = jnp.asarray(np.array([1.0, 2.0], np.float32))
    msg = (f"^to_jax: {fn} returned {kind}, not tensors; a function to_jax wraps must return tensors "
           r"\(call the module's function directly for other values\)(\n|$)")  # (jax.jit adds a note)
    for call in (getattr(j, fn), jax.jit(getattr(j, fn))):
        with pytest.raises(TypeError, match=msg):
            call(x)
    assert getattr(plain, fn)(np.ones(2, np.float32)) == {"norm2": 2.0, "name": "n2", "nothing": None}[fn]
