"""A Function<T>'s InferShape: output shapes without running the kernel (the bound
``<name>_infer_shape`` companion), checked against Forward under OPBUILDER_DEBUG, and used by
to_torch as the fake kernel (torch.compile fullgraph=True, opcheck) and by to_jax."""
from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import opbuilder
import runtime as rt
from opbuilder import Spec
from runtime import Tensor

from builder_util import child_env
from op_util import BINDINGS, CPP, load_op
from numeric_util import central

pytestmark = pytest.mark.build

_FLAGS = ["-Wall", "-Wextra", "-Werror"]


@pytest.fixture(scope="session", params=BINDINGS)
def shape_ops(cache_dir, request):
    """tests/cpp/infer_shape_ops.cpp bound with each layer."""
    return load_op("infer_shape_ops", [CPP / "infer_shape_ops.cpp"], cflags=_FLAGS, binding=request.param)


def _binding(module) -> str:
    return "nanobind" if type(module.outer).__name__ == "nb_func" else "pybind11"


def test_the_companion_gives_shapes_and_dtypes_without_running_forward(shape_ops):
    before = shape_ops.forward_calls()
    x, y = np.arange(3.0), np.arange(5.0)
    out = shape_ops.outer_infer_shape(x, y)
    assert type(out) is Tensor and out.shape == (3, 5) and out.dtype == rt.float64
    a, b = shape_ops.split_at_infer_shape(Tensor(np.arange(7.0)), 2)
    assert (a.shape, b.shape) == ((2,), (5,))
    # shapes only: a 0-stride array of any size costs nothing to pass
    big = np.broadcast_to(np.zeros((), np.float64), (10**9,))
    assert shape_ops.outer_infer_shape(big, y).shape == (10**9, 5)
    assert shape_ops.forward_calls() == before
    with pytest.raises(IndexError, match="^split_at: k out of range$"):  # the rule's own error
        shape_ops.split_at_infer_shape(Tensor(np.arange(7.0)), 8)


def test_the_companion_is_not_an_operator_of_the_bridges(shape_ops):
    pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")
    t = opbuilder.to_torch(shape_ops)
    assert hasattr(t, "outer") and not hasattr(t, "outer_infer_shape")


def test_forward_and_gradient_still_right(shape_ops):
    x, y = np.array([1.0, -2.0, 0.5]), np.array([3.0, 0.25])
    np.testing.assert_array_equal(shape_ops.outer(Tensor(x), Tensor(y)).asnumpy(), np.outer(x, y))
    w = np.arange(6.0).reshape(3, 2)

    def loss(a, b):
        return float((np.outer(a, b) * w).sum())
    gx, gy = rt.grad(lambda a, b: rt.ops.sum(shape_ops.outer(a, b) * Tensor(w)), grad_position=(0, 1))(
        Tensor(x), Tensor(y))
    np.testing.assert_allclose(gx.asnumpy(), central(lambda a: loss(a, y), x), rtol=1e-7)
    np.testing.assert_allclose(gy.asnumpy(), central(lambda b: loss(x, b), y), rtol=1e-7)


def test_without_debug_a_wrong_rule_is_not_checked(shape_ops):
    out = shape_ops.liar(Tensor(np.arange(3.0)))
    assert out.shape == (3,)
    assert shape_ops.liar_infer_shape(np.arange(3.0)).shape == (4,)


def test_debug_catches_a_wrong_rule(shape_ops, cache_dir):
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(CPP.parent)!r})
        import numpy as np
        import runtime as rt
        from runtime import Tensor
        from op_util import load_op, CPP
        m = load_op("infer_shape_ops", [CPP / "infer_shape_ops.cpp"], cflags={_FLAGS!r}, binding={_binding(shape_ops)!r})
        print(m.outer(Tensor(np.arange(3.0)), Tensor(np.arange(2.0))).shape)  # a right rule passes
        for call in (lambda: m.liar(Tensor(np.arange(3.0))),
                     lambda: m.liar(rt.Parameter(Tensor(np.arange(3.0)))),  # recording a node
                     lambda: m.to_int(Tensor(np.arange(3.0)))):
            try:
                call()
            except RuntimeError as e:
                print(type(e).__name__, e)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       env=child_env(OPBUILDER_CACHE_DIR=str(cache_dir), OPBUILDER_DEBUG="1"), timeout=300)
    assert r.returncode == 0, f"child exited {r.returncode}\n{r.stdout}\n{r.stderr}"
    why = " (debug runs check Forward against InferShape)"
    assert r.stdout.splitlines() == [
        "(3, 2)",
        "RuntimeError Liar::InferShape gives output 0 the shape [4], but Forward returned the shape [3]" + why,
        "RuntimeError Liar::InferShape gives output 0 the shape [4], but Forward returned the shape [3]" + why,
        "RuntimeError ToInt::Forward returned output 0 with dtype int64, but InferShape's outputs take the dtype "
        "of the first tensor argument, float64" + why,
    ]


def test_a_debug_build_checks_without_the_environment(cache_dir):
    m = load_op("infer_shape_debug_ops", [CPP / "infer_shape_ops.cpp"], cflags=_FLAGS, debug_mode=True)
    with pytest.raises(RuntimeError, match=r"^Liar::InferShape gives output 0 the shape \[3\], but Forward returned "
                                           r"the shape \[2\] \(debug runs check Forward against InferShape\)$"):
        m.liar(Tensor(np.arange(2.0)))
    assert m.outer(Tensor(np.arange(2.0)), Tensor(np.arange(3.0))).shape == (2, 3)


# ---- the bridges ----------------------------------------------------------------------------
def test_torch_compile_fullgraph_through_infer_shape(shape_ops):
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")
    t = opbuilder.to_torch(shape_ops)  # no shape_fn: the fake kernel asks InferShape
    f = torch.compile(lambda a, b: t.outer(a, b).sin(), fullgraph=True, backend="aot_eager")
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    y = torch.randn(4, dtype=torch.float64, requires_grad=True)
    out = f(x, y)
    torch.testing.assert_close(out, torch.outer(x, y).sin().detach())
    out.sum().backward()
    c = torch.cos(torch.outer(x, y)).detach()
    torch.testing.assert_close(x.grad, (c * y.detach()).sum(1))
    torch.testing.assert_close(y.grad, (c * x.detach()[:, None]).sum(0))
    g = torch.compile(lambda a: [p * 2 for p in t.split_at(a, 2)], fullgraph=True, backend="aot_eager")
    a, b = g(torch.arange(5.0, dtype=torch.float64))
    torch.testing.assert_close(a, torch.tensor([0.0, 2.0], dtype=torch.float64))
    torch.testing.assert_close(b, torch.tensor([4.0, 6.0, 8.0], dtype=torch.float64))


def test_torch_library_opcheck_through_infer_shape(shape_ops):
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")
    t = opbuilder.to_torch(shape_ops)
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    y = torch.randn(2, dtype=torch.float64, requires_grad=True)
    t.outer(x, y)
    torch.library.opcheck(getattr(torch.ops, t._namespace).outer_tt.default, (x, y))
    assert torch.autograd.gradcheck(t.outer, (x, y))


def test_a_given_shape_fn_wins_over_infer_shape(shape_ops):
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")
    calls = []

    def rule(x, y):
        calls.append((x, y))
        return Spec((x.shape[0], y.shape[0]), x.dtype)
    t = opbuilder.to_torch(shape_ops, shape_fn={"outer": rule})
    f = torch.compile(lambda a, b: t.outer(a, b), fullgraph=True, backend="aot_eager")
    f(torch.randn(2, dtype=torch.float64), torch.randn(3, dtype=torch.float64))
    assert calls


def test_to_jax_takes_shapes_from_infer_shape(shape_ops):
    jax = pytest.importorskip("jax")
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        j = opbuilder.to_jax(shape_ops)
        x, y = jax.numpy.arange(3.0), jax.numpy.arange(4.0)
        before = shape_ops.forward_calls()
        out = jax.jit(j.outer)(x, y)
        assert shape_ops.forward_calls() == before + 1  # shapes from the rule: the kernel ran once
        np.testing.assert_array_equal(np.asarray(out), np.outer(np.arange(3.0), np.arange(4.0)))
    finally:
        jax.config.update("jax_enable_x64", old)


# ---- a rule with the wrong signature: one static_assert naming the class --------------------
@pytest.mark.parametrize("cls, why", [
    ("IntInferShape", r"T::InferShape must return ShapeVector when Forward returns TensorPtr, and "
                      r"std::vector<ShapeVector> \(one shape per output\) when Forward returns TensorPtrList"),
    ("ContextInferShape", r"T::InferShape cannot be called with Forward's arguments \(without the "
                          r"AutogradContext \*\): it must be static"),
])
def test_a_wrong_infer_shape_signature_is_one_static_assert(cls, why):
    from opbuilder import BuildError, CustomOpBuilder
    src = CPP / "function_checks_ops.cpp"
    name = f"checks_{cls.lower()}"
    with pytest.raises(BuildError) as info:
        CustomOpBuilder(name, [src], cflags=[f"-DCHECK={cls}"]).build()
    lines = str(info.value).splitlines()
    assert lines[0] == f"building operator '{name}' failed:"
    assert re.match(r"\S+/opbuilder/detail/infer_shape\.h:\d+:\d+: error: static assert(ion)? failed: "
                    r"Function<T>: " + why, lines[1]), lines
    assert re.match(rf"  in struct opbuilder::detail::InferShapeChecks<{cls}, .*required from "
                    rf"{re.escape(str(src))}:\d+", lines[2]), lines
    assert sum(": error:" in line for line in lines) == 1, lines  # the assertion is the only error
