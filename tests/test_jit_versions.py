"""A jitted call's output written in place after the call, when the backward reads its memory: the backward
fails with eager's version error (the same type and message) instead of giving a wrong gradient, whether an
opaque op (a Python Function, a C++ Function) or a primitive reads it; a write the backward never reads
leaves the gradient right."""
from __future__ import annotations

import numpy as np
import pytest

import runtime as rt
from runtime import Tensor, jit, mint, ops
from runtime.autograd import Function
from runtime.autograd.gradcheck import gradcheck

from op_util import CPP, load_op
from jit_ops import Cube

RNG = np.random.default_rng(41)


@pytest.fixture(scope="module")
def counted(cache_dir):
    return load_op("jit_counted_ops", [CPP / "jit_counted_ops.cpp"], cflags=["-Wall", "-Wextra", "-Werror"])


class Exp(Function):
    """exp saving its output (its backward reads the memory of what it returned)."""

    @staticmethod
    def forward(ctx, x):
        y = Tensor(np.exp(x.asnumpy()))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        y, = ctx.saved_tensors
        return g * y


class Double(Function):
    """2 x, saving nothing."""

    @staticmethod
    def forward(ctx, x):
        return Tensor(2.0 * x.asnumpy())

    @staticmethod
    def backward(ctx, g):
        return g * 2.0


def _write_then_backward(fn, x):
    """Call ``fn``, add 1 in place to its first output, then backward from the sum of its last."""
    outs = fn(x)
    with rt.no_grad():
        ops.assign(outs[0], outs[0] + 1.0)
    mint.sum(outs[-1]).backward()


def _eager_error(fn, x):
    with pytest.raises(RuntimeError) as e:
        _write_then_backward(fn, x)
    return str(e.value)


def _check_as_eager(f):
    x = Tensor(RNG.standard_normal(4)).requires_grad_()
    msg = _eager_error(f, x)
    assert "modified by an in-place operation" in msg
    j = jit(f)
    j(x)  # builds
    with pytest.raises(RuntimeError) as e:
        _write_then_backward(j, Tensor(RNG.standard_normal(4)).requires_grad_())
    assert str(e.value) == msg


def test_two_chained_python_functions_the_first_saving_the_output_it_returns():
    _check_as_eager(lambda x: (lambda a: (a, Exp.apply(a)))(Exp.apply(x)))


def test_two_chained_cpp_functions_the_first_saving_the_output_it_returns(counted):
    _check_as_eager(lambda x: (lambda a: (a, counted.tanh(a)))(counted.tanh(x)))


def test_an_opaque_output_a_cube_saves_as_its_input():
    _check_as_eager(lambda x: (lambda a: (a, Cube.apply(a)))(Exp.apply(x) * 1.0))


@pytest.mark.parametrize("op", ["exp", "tanh", "sigmoid", "sqrt"])
@pytest.mark.parametrize("then", ["mul", "sin", "div"])
def test_a_primitive_output_another_primitive_takes(op, then):
    prim = getattr(mint, op)
    nxt = {"mul": lambda a: a * 2.0, "sin": mint.sin, "div": lambda a: 1.0 / (a + 3.0)}[then]

    def f(x):
        a = prim(mint.abs(x) + 0.5)
        return a, nxt(a)

    _check_as_eager(f)


def test_an_opaque_output_a_primitive_takes():
    _check_as_eager(lambda x: (lambda a: (a, mint.sin(a)))(Cube.apply(x)))


def test_a_primitive_output_only_its_own_derivative_reads_fails_under_jit_as_eagerly():
    """exp's rule reads its output: a write to it is caught, naming exp, under jit and eagerly alike."""
    msg = (r"^one of the tensors needed for gradient computation has been modified by an in-place operation: "
           r"output 0 of exp is at version 1; expected version 0$")
    j = jit(lambda x: mint.exp(x))
    x = Tensor(RNG.standard_normal(3)).requires_grad_()
    j(x)
    for f in (j, mint.exp):
        y = f(x)
        with rt.no_grad():
            y += 1.0
        with pytest.raises(RuntimeError, match=msg):
            mint.sum(y).backward()


def _written_then(fn, k):
    """``fn``'s output ``k`` after its output 0 got 1 added in place."""
    def run(x):
        outs = fn(x)
        with rt.no_grad():
            ops.assign(outs[0], outs[0] + 1.0)
        return outs[k]
    return run


@pytest.mark.parametrize("case", ["sin", "cube", "cube_double"])
def test_a_write_the_backward_never_reads_keeps_the_gradient_right(case):
    f = {"sin": lambda x: (mint.sin(x),),  # sin's derivative reads x, not its output
         "cube": lambda x: (Cube.apply(x),),  # Cube saves its input
         "cube_double": lambda x: (lambda c: (c, Double.apply(c)))(Cube.apply(x)),  # Double saves nothing
         }[case]
    x = Tensor(RNG.standard_normal(5))
    _written_then(f, -1)(x.requires_grad_())  # eagerly: no error
    j = jit(f)
    j(x)
    gradcheck(_written_then(j, -1), [Tensor(RNG.standard_normal(5))])
    gradcheck(_written_then(j, 0), [Tensor(RNG.standard_normal(5))])


@pytest.mark.parametrize("consumer", ["sin", "cube"])
def test_an_input_handed_back_and_written_fails_as_eagerly(consumer):
    """jit(lambda x: (x, sin(x))): the output is x's memory (eagerly it is x); writing it gave a wrong
    gradient under jit (cos(x + 1)) where eager raises sin's version error."""
    use = {"sin": mint.sin, "cube": Cube.apply}[consumer]
    _check_as_eager(lambda x: (x, use(x)))


def test_an_input_handed_back_and_written_that_only_feeds_exp_keeps_the_gradient_right():
    """exp's derivative reads its output, not x: a write to x changes no gradient, so neither eager
    (as PyTorch) nor jit raises, and both give 2 exp(x) of the x the forward saw."""
    def f(x):
        return x, mint.exp(x) * 2.0
    j = jit(f)
    j(Tensor(RNG.standard_normal(4)).requires_grad_())
    for fn in (f, j):
        x0 = RNG.standard_normal(4)
        x = Tensor(x0).requires_grad_()
        mint.sum(_written_then(fn, -1)(x)).backward()
        eps = 1e-6
        want = [(2 * np.exp(x0[i] + eps) - 2 * np.exp(x0[i] - eps)) / (2 * eps) for i in range(4)]
        np.testing.assert_allclose(x.grad.asnumpy(), want, rtol=1e-6)

