"""to_torch under torch.compile and torch.library.opcheck: the registered operators, which the Python
path makes and the C++ bridge never takes (so these run once, not on both paths as
test_interop_torch.py's tests do)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")

import opbuilder  # noqa: E402
from opbuilder import Spec  # noqa: E402

pytestmark = pytest.mark.build


def _broadcast(x, y):
    return Spec(np.broadcast_shapes(x.shape, y.shape), x.dtype)


@pytest.fixture(scope="module")
def tmul(my_ops):
    return opbuilder.to_torch(my_ops)


@pytest.fixture(scope="module")
def tmul_shaped(my_ops):
    return opbuilder.to_torch(my_ops, shape_fn={"mul": _broadcast})


def test_registered_with_torch_library_opcheck(tmul_shaped, tmul):
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    y = torch.randn(4, dtype=torch.float64, requires_grad=True)
    tmul_shaped.mul(x, y)
    op = getattr(torch.ops, tmul_shaped._namespace).mul_tt.default
    torch.library.opcheck(op, (x, y))
    tmul.mul(x, y)
    plain = getattr(torch.ops, tmul._namespace).mul_tt.default
    # without a shape rule there is no fake kernel: every check but the fake-tensor ones
    torch.library.opcheck(plain, (x, y), test_utils=("test_schema", "test_autograd_registration"))


def test_compile_fullgraph_with_shape_fn(my_ops):
    t = opbuilder.to_torch(my_ops, shape_fn={"mul": _broadcast})  # first call under torch.compile
    f = torch.compile(lambda a, b: t.mul(a, b).sin(), fullgraph=True, backend="aot_eager")
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    y = torch.randn(4, dtype=torch.float64, requires_grad=True)
    out = f(x, y)
    torch.testing.assert_close(out, (x * y).sin().detach())
    out.sum().backward()
    torch.testing.assert_close(x.grad, (torch.cos(x * y) * y).detach())
    torch.testing.assert_close(y.grad, (torch.cos(x * y) * x).sum(0).detach())


def test_compile_without_shape_fn_graph_breaks(tmul):
    f = torch.compile(lambda a, b: tmul.mul(a, b).sin(), backend="aot_eager")
    x, y = torch.randn(5), torch.randn(5)
    torch.testing.assert_close(f(x, y), (x * y).sin())
    with pytest.raises(Exception, match="disable"):
        torch.compile(lambda a, b: tmul.mul(a, b), fullgraph=True, backend="aot_eager")(x, y)
