"""The engine across node kinds: higher-order gradients of built-in ops, gradcheck's report."""
import numpy as np
import pytest

import runtime as rt
from runtime import Tensor, ops as F
from runtime.autograd import Function

OPS1 = [F.tanh, F.sigmoid, F.sin, lambda t: t * t, lambda t: F.exp(t * 0.1), lambda t: F.mean(t, axis=-1,
                                                                                                  keepdims=True)]
OPS2 = [F.add, F.mul, F.sub, lambda a, b: a / (1.5 + b * b)]
SHAPES = [(2, 3), (3,), (2, 1), ()]


def _random_function(local):
    seq = [(local.integers(len(OPS1)), local.integers(len(OPS2)), local.integers(3)) for _ in range(3)]

    def f(a, b, c):
        vals, h = [a, b, c], a
        for u, v, k in seq:
            h = OPS2[v](OPS1[u](h), vals[k])
        return h.sum()

    return f, seq


def test_second_order_gradients_of_random_broadcasting_compositions():
    local = np.random.default_rng(23)
    for trial in range(10):
        xs = [Tensor(local.standard_normal(SHAPES[i])) for i in local.integers(0, len(SHAPES), 3)]
        f, seq = _random_function(local)
        for pos in range(3):  # the gradient w.r.t. each input, differentiated w.r.t. all of them
            assert rt.gradcheck(rt.grad(f, grad_position=pos), xs), f"trial {trial}, position {pos}: {seq}"


def test_third_order_gradient_of_builtin_ops():
    x = Tensor(np.array([0.4, -0.7]))
    d3 = rt.grad(rt.grad(rt.grad(lambda t: (F.sin(t) * t).sum())))(x)
    a = x.asnumpy()
    np.testing.assert_allclose(d3.asnumpy(), -3 * np.sin(a) - a * np.cos(a))


def test_backward_with_create_graph_builds_a_differentiable_gradient():
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    (g,) = rt.autograd.grad([(x * x * x).sum()], [x], create_graph=True)
    assert g.requires_grad
    g.sum().backward()
    np.testing.assert_allclose(x.grad.asnumpy(), 6 * x.asnumpy())


def off_at(offsets):
    """A Function x * 2 whose backward is off by ``offsets[k]`` at flat element k."""
    class OffAt(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            out = g.asnumpy() * 2
            for k, d in offsets.items():
                out.flat[k] += d
            return out
    return OffAt


WrongAtOneElement = off_at({6: 0.5})  # element [1, 2] of a (2, 4) input


def test_gradcheck_reports_the_worst_element():
    x = Tensor(np.random.default_rng(0).standard_normal((2, 4)))
    with pytest.raises(rt.GradcheckError, match=r"gradcheck failed: input 0, element \[1, 2\]: analytic "
                                                r"-?[0-9.]+ vs numerical -?[0-9.]+ \(\|diff\| 0.\d+ > atol"):
        rt.gradcheck(WrongAtOneElement.apply, [x])
    assert rt.gradcheck(WrongAtOneElement.apply, [x], raise_exception=False) is False
    assert rt.gradcheck(lambda t: t * 2, [x])


def test_gradcheck_reports_the_input():
    y = Tensor(np.ones((2, 4)))
    with pytest.raises(rt.GradcheckError, match=r"input 1, element \[1, 2\]"):
        rt.gradcheck(lambda a, b: a * WrongAtOneElement.apply(b), [Tensor(np.ones(4)), y])


WrongTwice = off_at({0: 0.1, 5: 0.7})  # elements [0, 0] and [1, 1] of a (2, 4) input


def test_gradcheck_names_the_worst_element_not_the_first():
    rng = np.random.default_rng(1)
    a, b = Tensor(rng.standard_normal((2, 4))), Tensor(rng.standard_normal((2, 4)))
    # off by 0.1 at [0, 0] and by 0.7 at [1, 1]: the larger error, found later, is reported
    with pytest.raises(rt.GradcheckError, match=r"input 0, element \[1, 1\]: analytic"):
        rt.gradcheck(lambda x, y: WrongTwice.apply(x) + y, [a, b])
    # input 0 off by 0.5 at [1, 2], input 1 by 0.7 at [1, 1]: the later input is the worse one
    with pytest.raises(rt.GradcheckError, match=r"input 1, element \[1, 1\]: analytic"):
        rt.gradcheck(lambda x, y: WrongAtOneElement.apply(x) + WrongTwice.apply(y), [a, b])


def test_gradcheck_failure_in_float32_says_why():
    x = Tensor(np.random.default_rng(2).uniform(0.5, 1.0, (3,)).astype(np.float32))
    with pytest.raises(rt.GradcheckError, match=r"the inputs include float32: differences at that precision "
                                                r"are inaccurate at eps=1e-06; check with float64 inputs"):
        rt.gradcheck(rt.ops.sin, [x])
    assert rt.gradcheck(rt.ops.sin, [x], eps=1e-2, atol=1e-3, rtol=1e-2)  # a coarser check passes
    assert rt.gradcheck(rt.ops.sin, [Tensor(x.asnumpy().astype(np.float64))])  # float64 passes at the defaults


def test_gradcheck_needs_a_floating_input():
    with pytest.raises(ValueError, match="at least one floating-point Tensor"):
        rt.gradcheck(lambda t: t, [Tensor(np.arange(3))])


class Explodes(Function):
    """x * 1 whose backward must not run."""

    @staticmethod
    def forward(ctx, x):
        return x * 1

    @staticmethod
    def backward(ctx, g):
        raise AssertionError("Explodes.backward ran")


@pytest.mark.parametrize("head", [lambda z: z, lambda z: z.sum()], ids=["one_node", "graph"])
def test_nodes_that_reach_no_target_do_not_run(head):
    x, w = Tensor(np.ones(3), requires_grad=True), Tensor(np.ones(3), requires_grad=True)
    out = head(Explodes.apply(x))
    assert rt.autograd.grad([out], [w], [Tensor(np.ones(out.shape))], allow_unused=True) == [None]


def test_autograd_grad_of_an_unused_input_is_an_error_unless_allowed():
    x, w = Tensor(np.ones(3), requires_grad=True), Tensor(np.ones(3), requires_grad=True)
    with pytest.raises(RuntimeError, match=r"input 1 was not used to compute the outputs \(pass allow_unused=True"):
        rt.autograd.grad([(x * 2).sum()], [x, w])


@pytest.mark.parametrize("allow_unused", [False, True])
def test_autograd_grad_of_an_input_that_does_not_require_grad_is_an_error(allow_unused):
    """torch: "One of the differentiated Tensors does not require grad", with allow_unused or without
    (before, allow_unused=True gave None for it, silently)."""
    w, x = Tensor(np.ones(3), requires_grad=True), Tensor(np.ones(3))
    y = (w * 2).sum()
    with pytest.raises(RuntimeError, match=r"^autograd.grad: input 1 does not require grad \(one of the "
                                           r"differentiated tensors does not require grad\); call requires_grad_"):
        rt.autograd.grad([y], [w, x], allow_unused=allow_unused)
    with pytest.raises(TypeError, match=r"^autograd.grad: input 1 is a float, not a Tensor$"):
        rt.autograd.grad([y], [w, 3.0], allow_unused=allow_unused)


def test_autograd_grad_of_an_output_that_does_not_require_grad_is_an_error():
    """torch: "element 0 of tensors does not require grad and does not have a grad_fn" (before: the
    input was said to be unused)."""
    w, x = Tensor(np.ones(3), requires_grad=True), Tensor(np.ones(3))
    with pytest.raises(RuntimeError, match=r"^autograd.grad: output 1 does not require grad and has no history"):
        rt.autograd.grad([(w * 2).sum(), (x * 2).sum()], [w])


def test_backward_adds_into_the_same_grad_tensor_as_torch():
    """torch's AccumulateGrad adds a later gradient into the tensor already in ``.grad``: a reference
    taken before sees the sum, and the tensor's write count goes up. With create_graph, a new tensor."""
    w = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    (w * 2).sum().backward()
    g = w.grad
    v = g._version
    (w * w).sum().backward()
    assert w.grad is g and g._version == v + 1
    np.testing.assert_allclose(g.asnumpy(), [2 + 2 * 1.0, 2 + 2 * 2.0])
    (w * 3).sum().backward(create_graph=True)
    assert w.grad is not g
    np.testing.assert_allclose(w.grad.asnumpy(), [7.0, 9.0])
    np.testing.assert_allclose(g.asnumpy(), [4.0, 6.0])


def test_a_grad_that_cannot_take_the_sum_in_place_is_replaced():
    """A read-only gradient (a broadcast numpy array put in ``.grad``) gets a new tensor holding the sum;
    nothing is written into the caller's memory."""
    w = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    ro = np.broadcast_to(np.array(1.0), (2,))
    w.grad = Tensor._from_array(ro)
    (w * 2).sum().backward()
    np.testing.assert_allclose(w.grad.asnumpy(), [3.0, 3.0])
    assert ro.tolist() == [1.0, 1.0]


def test_a_grad_assignment_is_checked_as_torch_checks_it():
    """torch refuses, at the assignment, a .grad that is no tensor, of another shape, dtype or device, or
    the tensor itself; here they were taken and broadcast or promoted into the next backward's sum."""
    w = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    with pytest.raises(TypeError, match=r"^assigned grad expected to be a Tensor or None but got grad of type ndarray$"):
        w.grad = np.ones(2)
    with pytest.raises(RuntimeError, match=r"^attempting to assign a gradient of shape \[3\] to a tensor of shape "
                                           r"\[2\]; they must be the same$"):
        w.grad = Tensor(np.ones(3))
    with pytest.raises(RuntimeError, match=r"^attempting to assign a gradient of dtype Float32 to a tensor of dtype "
                                           r"Float64; they must be the same$"):
        w.grad = Tensor(np.ones(2, np.float32))
    with pytest.raises(RuntimeError, match=r"^can't assign a tensor as its own grad$"):
        w.grad = w
    assert w.grad is None
    w.grad = Tensor(np.ones(2))
    del w.grad
    assert w.grad is None


def test_a_grad_whose_elements_share_memory_is_replaced_not_written():
    """A stride-0 view put in ``.grad``: adding into it in place would add every element into one memory
    location (wrong gradient, and the viewed tensor written)."""
    w, z = Tensor(np.array([1.0, 2.0]), requires_grad=True), Tensor(np.zeros(1))
    w.grad = z.broadcast_to((2,))
    (w * Tensor(np.array([2.0, 3.0]))).sum().backward()
    np.testing.assert_allclose(w.grad.asnumpy(), [2.0, 3.0])
    assert z.asnumpy().tolist() == [0.0]


def test_a_shallow_copy_has_no_grad_of_its_own_yet():
    """torch's copy.copy: the memory is shared, .grad is not; sharing it let a backward through the
    copy add into the original's gradient."""
    import copy
    w = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    (w * 2).sum().backward()
    w2 = copy.copy(w)
    assert w2.grad is None and w2.requires_grad
    (w2 * 5).sum().backward()
    np.testing.assert_allclose(w.grad.asnumpy(), [2.0, 2.0])
    np.testing.assert_allclose(w2.grad.asnumpy(), [5.0, 5.0])


def test_backward_on_threads_into_one_leaf_adds_every_gradient_whole():
    """Accumulation into a shared .grad is one step at a time (torch locks AccumulateGrad): no element
    loses an addition, none is torn."""
    import threading
    w = Tensor(np.ones(200_000, np.float32), requires_grad=True)
    (w * 1).sum().backward()

    def work():
        for _ in range(10):
            (w * 1).sum().backward()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    g = w.grad.asnumpy()
    assert g.min() == g.max() == 41.0


def test_a_grad_of_another_shape_is_an_error_and_nothing_changes():
    """A .grad left from before a Parameter's shape changed was broadcast into the new gradient (torch:
    "output with shape [3] doesn't match the broadcast shape [2, 3]"). Checked for every leaf first."""
    p = rt.Parameter(np.ones(3, np.float32), name="p")
    q = rt.Parameter(np.ones(2, np.float32), name="q")
    (p * 2).sum().backward()
    (q * 3).sum().backward()
    q.set_data(Tensor(np.ones((2, 2), np.float32)), slice_shape=True)
    with pytest.raises(RuntimeError, match=r"^backward\(\): a gradient of shape \[2, 2\] cannot be added to .grad "
                                           r"of shape \[2\] .*No .grad was changed$"):
        ((p * 1).sum() + q.sum()).backward()
    np.testing.assert_array_equal(p.grad.asnumpy(), [2.0, 2.0, 2.0])


def test_autograd_grad_with_no_inputs_is_an_error():
    w = Tensor(np.ones(2), requires_grad=True)
    with pytest.raises(RuntimeError, match=r"^autograd.grad: inputs is empty"):
        rt.autograd.grad([(w * 2).sum()], [])


@pytest.mark.parametrize("wrap", [lambda z: z, lambda z: z.sum()], ids=["one_node", "graph"])
def test_a_leaf_used_twice_by_one_node_gets_both_gradients(my_ops, wrap):
    x = Tensor(np.array([1.5, -2.0]))
    g = rt.grad(lambda t: wrap(my_ops.mul(t, t)))(x)
    np.testing.assert_allclose(g.asnumpy(), 2 * x.asnumpy())


def test_a_recorded_binary_op_keeps_its_metas_after_backward_frees_it():
    x = Tensor(np.ones((2, 3), np.float32), requires_grad=True)
    y = Tensor(np.ones((3,), np.float64), requires_grad=True)
    out = x * y
    node = out._node
    before = (node.input_meta, node.out_meta)
    assert before == ((((2, 3), np.dtype(np.float32)), ((3,), np.dtype(np.float64))),
                      (((2, 3), np.dtype(np.float64)),))
    out.sum().backward()
    assert node.args is None  # the saved tensors are freed ...
    assert (node.input_meta, node.out_meta) == before  # ... what the engine checks gradients against is kept
    assert x.grad.shape == (2, 3) and x.grad.dtype == rt.float32
    assert y.grad.shape == (3,) and np.allclose(y.grad.asnumpy(), 2.0)


def test_autograd_grad_takes_single_tensors_and_refuses_a_non_scalar_without_grad_outputs():
    from runtime.autograd import grad
    x = Tensor(np.array([1.0, 2.0, 3.0]))
    x.requires_grad_()
    loss = F.sum(x * x)
    (g,) = grad(loss, x, retain_graph=True)
    np.testing.assert_array_equal(g.asnumpy(), [2.0, 4.0, 6.0])
    (g,) = grad([loss], x)
    np.testing.assert_array_equal(g.asnumpy(), [2.0, 4.0, 6.0])
    y = x * 3.0
    with pytest.raises(RuntimeError, match=r"^autograd\.grad: output 0 has shape \[3\]; without grad_outputs each "
                                           r"output must have one element$"):
        grad(y, x)
    (g,) = grad(y, x, grad_outputs=Tensor(np.ones(3)))
    np.testing.assert_array_equal(g.asnumpy(), [3.0, 3.0, 3.0])


def test_grad_outputs_may_be_one_array_and_must_match_the_outputs_in_number():
    """A bare numpy array as grad_outputs was walked row by row (a [3] gradient for a [2, 3] output);
    a list of the wrong length was silently cut to the shorter one."""
    from runtime.autograd import backward, grad
    x = Tensor(np.arange(6.0).reshape(2, 3)).requires_grad_()
    y = x * 3.0
    g_out = np.arange(6.0).reshape(2, 3)
    (g,) = grad(y, x, grad_outputs=g_out, retain_graph=True)
    np.testing.assert_array_equal(g.asnumpy(), 3.0 * g_out)
    with pytest.raises(RuntimeError, match=r"^autograd\.grad: grad_outputs has 2 gradient\(s\) for 1 output\(s\)"):
        grad([y], x, grad_outputs=[g_out, g_out])
    with pytest.raises(RuntimeError, match=r"^backward\(\): grad_tensors has 0 gradient\(s\) for 1 output\(s\)"):
        backward(y, [])
    backward(y, g_out)  # one tensor and one array, as torch.autograd.backward takes them
    np.testing.assert_array_equal(x.grad.asnumpy(), 3.0 * g_out)


@pytest.mark.parametrize("op", ["exp", "tanh", "sigmoid", "sqrt"])
def test_an_output_its_own_rule_reads_written_in_place_is_a_version_error(op):
    """exp's node kept its output unchecked: y += 1 under no_grad, then backward, gave e^x + 1 silently
    (PyTorch raises; so does a jitted call since 590fd1f)."""
    x = Tensor(np.array([0.3, 0.7])).requires_grad_()
    y = getattr(F, op)(x)
    with rt.no_grad():
        y += 1.0
    with pytest.raises(RuntimeError, match=rf"^one of the tensors needed for gradient computation has been "
                                           rf"modified by an in-place operation: output 0 of {op} is at version 1; "
                                           rf"expected version 0$"):
        F.sum(y).backward()


def test_an_output_no_rule_reads_may_be_written_in_place_before_backward():
    """mul and mean keep their inputs, not their outputs: writing an output leaves the gradient right."""
    x = Tensor(np.array([0.3, 0.7])).requires_grad_()
    y = x * 3.0
    m = F.mean(x * 2.0)
    with rt.no_grad():
        y += 1.0
        m += 1.0
    m.backward()
    np.testing.assert_allclose(x.grad.asnumpy(), [1.0, 1.0])
    y.backward(Tensor(np.ones(2)))
    np.testing.assert_allclose(x.grad.asnumpy(), [4.0, 4.0])


def test_a_given_gradient_of_another_shape_is_refused():
    """It was summed down or broadcast to fit: backward(ones((2, 3))) for a (3,) output gave twice the
    gradient, unseen. torch refuses it; so does the runtime now, naming both shapes."""
    import runtime as rt
    x = rt.Tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    with pytest.raises(RuntimeError, match=r"^backward\(\): the gradient given for output 0 has shape \[2, 3\], "
                                           r"the output \[3\]; they must match$"):
        (x * 2).backward(rt.Tensor(np.ones((2, 3))))
    with pytest.raises(RuntimeError, match=r"^autograd.grad: the gradient given for output 0 has shape \[1\], "
                                           r"the output \[\]; they must match$"):
        rt.autograd.grad((x * 2).sum(), x, rt.Tensor(np.array([2.0])))
    assert x.grad is None


def test_pow_gradient_at_base_zero_and_exponent_zero_is_zero():
    """y x^(y-1) is 0 * 0^-1 = NaN there; x^0 is 1 for every x, so its slope is 0 (torch's 0 too), and the
    higher derivatives of x and x^2 at 0 are 0, not NaN."""
    import warnings
    import runtime as rt
    from runtime.autograd import grad
    x = rt.Tensor(np.array(0.0), requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and no numpy warning from a discarded 0^-1
        assert grad((x ** rt.Tensor(np.array([0.0, 1.0, 2.0, 3.0]))).sum(), x)[0].item() == 1.0
        for e, order in ((0.0, 1), (1.0, 2), (2.0, 3)):
            g = x ** e
            for _ in range(order):
                g = grad(g, x, create_graph=True)[0]
            assert g.item() == 0.0, (e, order)
