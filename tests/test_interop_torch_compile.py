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


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_an_output_of_a_compiled_op_may_be_written_afterwards(tmul_shaped, backend):
    """torch's x * y saves x and y, not its output: a write into the output afterwards (outside the graph,
    or inside it: nn.ReLU(inplace=True) after the op) is allowed. On 991a33e a compiled op's node saved its
    outputs too, and the backward refused either write (a version error; at compile time, inside)."""
    xa, ya = np.random.default_rng(7).standard_normal((2, 4, 3))
    for inside in (False, True):
        got = []
        for mul in (torch.mul, tmul_shaped.mul):
            x, y = (torch.tensor(a, requires_grad=True) for a in (xa, ya))
            if inside:
                f = torch.compile(lambda a, b: torch.nn.functional.relu(mul(a, b), inplace=True) * 2,
                                  backend=backend, fullgraph=True)
                f(x, y).sum().backward()
            else:
                z = torch.compile(lambda a, b: mul(a, b), backend=backend, fullgraph=True)(x, y)
                z.add_(1.0)
                z.sum().backward()
            got.append((x.grad.numpy(), y.grad.numpy()))
        for a, b in zip(*got):
            np.testing.assert_allclose(b, a, rtol=1e-12)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_new_output_with_other_strides_in_a_compiled_graph(api_ops, backend):
    """transposed_copy returns a new tensor in transposed order. Its fake (from the shape rule: a Spec has
    no strides) is contiguous; inductor checked the real strides against it: "expected ... stride 1==2"
    blaming the fake kernel (attack on 30a3d5f). In a graph the kernel gives it contiguous."""
    t = opbuilder.to_torch(api_ops, shape_fn={"transposed_copy": lambda a: Spec(a.shape[::-1], a.dtype)})
    x = torch.arange(6.0, dtype=torch.float64).view(2, 3)
    assert t.transposed_copy(x).stride() == (1, 3)  # eagerly as the operator made it
    got = torch.compile(lambda a: t.transposed_copy(a) + 1, fullgraph=True, backend=backend)(x)
    torch.testing.assert_close(got, x.t() + 1)


def test_fake_tensors_without_a_shape_rule_name_the_rule(tmul):
    """Under torch's FakeTensorMode (export, AOT tracing) an operator without a shape rule said its argument
    was "a meta tensor", to be moved with .to('cpu'), of a tensor whose device is cpu (attack on 30a3d5f)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        x = torch.empty(3, dtype=torch.float64)
        with pytest.raises(ValueError, match=r"^mul: argument 0 is a fake tensor \(torch's FakeTensorMode: export, "
                                             r"AOT tracing, shape propagation\), which has no data to run it on; a "
                                             r"shape rule gives its outputs without a run: to_torch's shape_fn for "
                                             r"'mul', or a C\+\+ InferShape"):
            tmul.mul(x, x)


def test_a_mutates_function_returning_tensors_is_refused_in_a_compiled_graph(autograd_ops):
    """add_ (x += y, MarkDirty, returns x) declared in mutates, with a shape rule, compiled on its first call:
    on 991a33e the graph returned None for it (the write done); now a named error, and later compiles run
    it eagerly (a graph break) with eager's result."""
    t = opbuilder.to_torch(autograd_ops, shape_fn={"add_": lambda x, y: Spec(x.shape, x.dtype)},
                           mutates={"add_": [0]})
    torch._dynamo.reset()
    msg = (r"add_ is declared in mutates and returns tensors, which its compiled form cannot give \(a torch "
           r"operator's outputs are new memory of its own, and one defined while torch.compile traced it is "
           r"taken for an out= function, returning nothing\): return nothing from it \(the out= pattern, its shape "
           r"rule giving no outputs\), or drop mutates= \(torch.compile then runs it eagerly\); this call ran it, "
           r"and whether its write reached the caller's tensors depends on the backend \(aot_eager writes a "
           r"functional copy\)")
    one = torch.ones(3, dtype=torch.float64)
    with pytest.raises(RuntimeError, match=msg):
        torch.compile(lambda a, b: t.add_(a * 1, b), backend="aot_eager")(one, one)
    got = torch.compile(lambda a, b: t.add_(a * 1, b), backend="aot_eager")(one, one)
    np.testing.assert_allclose(got.numpy(), [2.0, 2.0, 2.0])
    torch._dynamo.reset()
