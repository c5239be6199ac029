"""The design's example: build, use inside nn.Cell, value_and_grad; exact values."""
import subprocess
import sys

import numpy as np
import pytest

import runtime as rt
from runtime import Tensor

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)


@pytest.fixture(params=["my_ops", "ms_ops"])
def ops(request):
    return request.getfixturevalue(request.param)


@pytest.mark.parametrize("source,name", [("function_ops.cpp", "my_ops"), ("ms_style_ops.cpp", "ms_ops")])
def test_example_values(source, name, request):
    """The demo itself (opbuilder/demo.py: the design's example) with each custom_src file."""
    request.getfixturevalue(name)  # built once per session; the demo then loads it warm
    from opbuilder.demo import run_demo
    printed = []
    out, grads = run_demo(source=source, name=name, echo=printed.append)
    assert isinstance(out, Tensor) and out.dtype == rt.float32 and out.shape == ()
    assert out.item() == 12.0
    (gx, gy), (gp,) = grads
    assert (gx.item(), gy.item(), gp.item()) == (6.0, 4.0, 6.0)
    assert all(g.dtype == rt.float32 for g in (gx, gy, gp))
    assert printed == [
        "out: 12.0",
        "grads[0]: (Tensor(shape=[], dtype=Float32, value= 6), Tensor(shape=[], dtype=Float32, value= 4))",
        "grads[1]: (Tensor(shape=[], dtype=Float32, value= 6),)",
    ]


def test_demo_command_prints_the_three_results(my_ops):
    # my_ops is already built in this session's cache, so this is a warm run
    out = subprocess.run([sys.executable, "-m", "opbuilder", "demo"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "out: 12.0",
        "grads[0]: (Tensor(shape=[], dtype=Float32, value= 6), Tensor(shape=[], dtype=Float32, value= 4))",
        "grads[1]: (Tensor(shape=[], dtype=Float32, value= 6),)",
    ]


def test_custom_mul_broadcasts_like_numpy(ops):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    b = rng.standard_normal((3, 1)).astype(np.float32)
    np.testing.assert_array_equal(ops.mul(Tensor(a), Tensor(b)).asnumpy(), a * b)
    # non-contiguous input (a transposed view)
    np.testing.assert_array_equal(ops.mul(rt.from_numpy(a.transpose(0, 2, 1)), rt.from_numpy(b.T)).asnumpy(),
                                  a.transpose(0, 2, 1) * b.T)


def test_custom_mul_rejects_incompatible_shapes(ops):
    with pytest.raises(ValueError, match="broadcast|mul"):
        ops.mul(Tensor(np.ones((2, 3), np.float32)), Tensor(np.ones((4,), np.float32)))
