"""C++ Function<T> / AutogradContext semantics (operators in tests/cpp/autograd_ops.cpp)."""
import os

import numpy as np
import pytest

import runtime as rt
from runtime import Tensor, ops as F

rng = np.random.default_rng(1)


def T(*shape, requires_grad=False):
    return Tensor(rng.standard_normal(shape), requires_grad=requires_grad)


def nonleaf(*shape):
    """A tensor with history (x * 1 of a leaf that requires grad)."""
    return T(*shape, requires_grad=True) * 1


# ---- multiple outputs --------------------------------------------------------------
def test_multiple_outputs_gradients_match_numerical(autograd_ops):
    assert rt.gradcheck(lambda x: autograd_ops.two_scales(x, True), [T(2, 3)])
    assert rt.gradcheck(lambda x: autograd_ops.two_scales(x, False), [T(4)])


def test_outputs_are_results_of_one_node_by_position(autograd_ops):
    a, b = autograd_ops.two_scales(T(3, requires_grad=True), True)
    assert a._node is b._node and (a._out_index, b._out_index) == (0, 1)
    assert a.requires_grad and b.requires_grad and a._node.name == "TwoScales"


@pytest.mark.parametrize("materialize,use,expect_null", [
    (True, 0, [False, False]), (True, 1, [False, False]),
    (False, 0, [False, True]), (False, 1, [True, False])])
def test_unused_output_gradient_is_zeros_or_null(autograd_ops, materialize, use, expect_null):
    x = T(3, requires_grad=True)
    outs = autograd_ops.two_scales(x, materialize)
    outs[use].sum().backward()
    assert autograd_ops.last_null() == expect_null
    np.testing.assert_allclose(x.grad.asnumpy(), np.full(3, 2.0 if use == 0 else 3.0))


# ---- MarkNonDifferentiable ----------------------------------------------------------
def test_non_differentiable_output_has_no_grad_and_passes_none(autograd_ops):
    x = T(4, requires_grad=True)
    sq, sign = autograd_ops.square_and_sign(x)
    assert sq.requires_grad and not sign.requires_grad and sign._node is None
    np.testing.assert_array_equal(sign.asnumpy(), np.sign(x.asnumpy()))
    (sq + sign * 5).sum().backward()  # nothing flows through sign
    np.testing.assert_allclose(x.grad.asnumpy(), 2 * x.asnumpy())
    assert autograd_ops.last_null() == [False, False]  # materialized: zeros for sign
    assert rt.gradcheck(lambda t: autograd_ops.square_and_sign(t)[0], [T(2, 2)])


# ---- MarkDirty ---------------------------------------------------------------------
def test_in_place_op_returns_its_input_with_new_version_and_history(autograd_ops):
    w = nonleaf(3)
    y = T(3)
    before = w.asnumpy().copy()
    r = autograd_ops.add_(w, y)
    assert r is w and w._version == 1 and w._node.name == "AddInplace"
    np.testing.assert_allclose(w.asnumpy(), before + y.asnumpy())


@pytest.mark.parametrize("backward", [True, False])
def test_in_place_and_non_differentiable_outputs_are_freed(autograd_ops, backward):
    """Nothing the node keeps refers back to its outputs (no cycle the collector cannot see)."""
    import gc
    import weakref
    w = nonleaf(3)
    autograd_ops.add_(w, T(3))  # w is now the node's output, in place
    sq, sign = autograd_ops.square_and_sign(nonleaf(4))
    refs = [weakref.ref(t) for t in (w, sq, sign)]
    if backward:
        (w.sum() + sq.sum()).backward()
    del w, sq, sign
    gc.collect()
    assert [r() for r in refs] == [None, None, None]


def test_in_place_op_gradients_match_numerical(autograd_ops):
    assert rt.gradcheck(lambda a, b: autograd_ops.add_(a * 1, b) * a, [T(2, 3), T(2, 3)])


def test_in_place_op_without_grad_bumps_version(autograd_ops):
    x, y = T(2), T(2)
    r = autograd_ops.add_(x, y)
    assert r is x and x._version == 1 and x._node is None and not x.requires_grad


def test_in_place_op_on_a_view_bumps_the_version_of_its_base(autograd_ops):
    """MarkDirty sets ``_version`` through the view, on the counter of the memory it views: the check of
    the saved exp output (the view's base) sees the write."""
    y = T(2, 2, requires_grad=True).exp()
    with rt.no_grad():
        autograd_ops.add_(y.reshape(4), T(4))
    assert y._version == 1
    with pytest.raises(RuntimeError, match=r"output 0 of exp is at version 1; expected version 0"):
        y.sum().backward()


def test_in_place_op_on_leaf_that_requires_grad_is_an_error(autograd_ops):
    x = T(2, requires_grad=True)
    before = x.asnumpy().copy()
    with pytest.raises(RuntimeError, match="AddInplace modifies argument 0 in place .*leaf that requires grad"):
        autograd_ops.add_(x, T(2))
    # refused before Forward's write counts (issue 33 #14): the values are put back, nothing was written
    assert x._node is None and x._version == 0
    np.testing.assert_array_equal(x.asnumpy(), before)


@pytest.mark.parametrize("grad", [True, False])
def test_mark_dirty_of_a_tensor_not_returned_is_an_error(autograd_ops, grad):
    x = nonleaf(2) if grad else T(2)
    with pytest.raises(RuntimeError, match="BadDirty: argument 0 was given to MarkDirty but not returned"):
        autograd_ops.bad_dirty(x, "not_returned")


@pytest.mark.parametrize("grad", [True, False])
def test_mark_dirty_of_a_tensor_that_is_no_argument_is_an_error(autograd_ops, grad):
    x = nonleaf(2) if grad else T(2)
    with pytest.raises(RuntimeError, match="BadDirty: MarkDirty was given a tensor that is not an argument"):
        autograd_ops.bad_dirty(x, "not_input")


# ---- in-place writes without MarkDirty ----------------------------------------------
@pytest.mark.parametrize("shape,mode", [((3,), "all"), ((3,), "one"), ((16, 16), "one"),
                                        ((1000, 1000), "all")])
def test_unmarked_write_to_an_argument_is_an_error_that_records_nothing(autograd_ops, shape, mode):
    x = nonleaf(*shape)
    node, version = x._node, x._version
    with pytest.raises(RuntimeError, match="SneakyScale::Forward modified argument 0 in place without MarkDirty"):
        autograd_ops.sneaky_scale(x, mode)
    assert x._node is node and x._version == version + 1


@pytest.mark.parametrize("rows", [4, 300])  # compared whole / by samples
def test_unmarked_write_to_a_strided_argument_is_an_error(autograd_ops, rows):
    x = nonleaf(rows, 40)[:, ::2]
    assert not x.asnumpy().flags.c_contiguous
    with pytest.raises(RuntimeError, match="SneakyScale::Forward modified argument 0"):
        autograd_ops.sneaky_scale(x, "all")


def test_unmarked_write_is_not_checked_without_recording(autograd_ops):
    # documented: the fingerprint is taken only when a node is recorded
    x = T(3)
    before = x.asnumpy().copy()
    out = autograd_ops.sneaky_scale(x, "all")
    np.testing.assert_allclose(x.asnumpy(), 2 * before)  # written in place, unnoticed
    np.testing.assert_allclose(out.asnumpy(), 2 * before)


# ---- saved tensors -----------------------------------------------------------------
def test_saved_input_changed_in_place_is_detected(autograd_ops):
    x, y = T(3, requires_grad=True), T(3)
    z = autograd_ops.mul_saved(x, y)
    autograd_ops.add_(y, T(3))  # y needs no grad: no node, but its version goes up
    with pytest.raises(RuntimeError, match=r"saved for backward by MulSaved \(saved slot 1\) has been modified "
                                           r"by an in-place operation: it is at version 1, but was saved at "
                                           r"version 0"):
        z.sum().backward()


def test_saved_output_changed_in_place_is_detected(autograd_ops):
    x = T(3, requires_grad=True)
    out = autograd_ops.exp_saves_output(x)
    autograd_ops.add_(out, T(3))
    with pytest.raises(RuntimeError, match=r"ExpSavesOutput \(saved slot 0\) has been modified by an in-place"):
        out.sum().backward()


def test_saved_output_gradients_match_numerical(autograd_ops):
    assert rt.gradcheck(autograd_ops.exp_saves_output, [T(2, 3)])


def test_save_for_backward_through_a_member_pointer(autograd_ops):
    # the source takes &AutogradContext::SaveForBackward (its build failed while two overloads existed)
    x = T(2, 3, requires_grad=True)
    autograd_ops.square_saved_by_pointer(x).sum().backward()
    np.testing.assert_allclose(x.grad.asnumpy(), 2 * x.asnumpy())
    assert rt.gradcheck(autograd_ops.square_saved_by_pointer, [T(2, 3)])


def test_backward_twice_needs_retain_graph(autograd_ops):
    x, y = T(2, requires_grad=True), T(2)
    z = autograd_ops.mul_saved(x, y)
    ones = Tensor(np.ones(2))
    z.backward(ones, retain_graph=True)
    z.backward(ones)
    np.testing.assert_allclose(x.grad.asnumpy(), 2 * y.asnumpy())
    with pytest.raises(RuntimeError, match="backward through MulSaved a second time"):
        z.backward(ones)


# ---- what Backward returns -----------------------------------------------------------
def _misbehave(ops, mode):
    x, y = T(2, 3, requires_grad=True), T(2, 3, requires_grad=True)
    ops.misbehave(x, y, mode).sum().backward()
    return x, y


def test_too_few_gradients_is_an_error_naming_the_missing_argument(autograd_ops):
    with pytest.raises(RuntimeError, match="backward of Misbehave returned 1 gradients, but its forward took 3 "
                                           "arguments and argument 1 needs a gradient"):
        _misbehave(autograd_ops, "too_few")


def test_too_many_gradients_is_an_error(autograd_ops):
    with pytest.raises(RuntimeError, match="backward of Misbehave returned 4 gradients, but its forward "
                                           "took 3 arguments"):
        _misbehave(autograd_ops, "too_many")


@pytest.mark.parametrize("mode", ["extra_nulls", "omit_trailing"])
def test_trailing_null_gradients_may_be_added_or_left_off(autograd_ops, mode):
    x, y = _misbehave(autograd_ops, mode)
    np.testing.assert_allclose(x.grad.asnumpy(), y.asnumpy())
    np.testing.assert_allclose(y.grad.asnumpy(), x.asnumpy())


def test_gradient_of_an_unrelated_shape_is_an_error(autograd_ops):
    with pytest.raises(RuntimeError, match=r"backward of Misbehave returned a gradient of shape \[7\] for "
                                           r"argument 0, whose shape is \[2, 3\]"):
        _misbehave(autograd_ops, "bad_shape")


def test_gradient_of_a_broadcast_shape_is_summed_down(autograd_ops):
    x, y = _misbehave(autograd_ops, "broadcast")
    np.testing.assert_allclose(x.grad.asnumpy(), y.asnumpy())
    assert x.grad.shape == (2, 3)


def test_gradient_of_the_wrong_dtype_is_an_error(autograd_ops):
    with pytest.raises(TypeError, match="backward of Misbehave returned a gradient of dtype float32 for "
                                        "argument 0, whose dtype is float64"):
        _misbehave(autograd_ops, "bad_dtype")


def test_gradient_for_a_non_tensor_argument_is_an_error(autograd_ops):
    with pytest.raises(RuntimeError, match="backward of Misbehave returned a gradient for argument 2, which is "
                                           "not a tensor"):
        _misbehave(autograd_ops, "non_tensor")


def test_need_grad_by_tensor_in_backward_is_an_error(autograd_ops):
    with pytest.raises(RuntimeError, match="Misbehave: NeedGrad\\(tensor\\) works inside Forward; in Backward "
                                           "use NeedsInputGrad"):
        _misbehave(autograd_ops, "need_grad")


# ---- exceptions ----------------------------------------------------------------------
# (kind thrown, Python type, message with {who}/{where} for the Function and the phase). pybind11's
# mapping, in Forward and Backward alike: the three, then the rest of the standard exceptions
# (domain/length/range errors are ValueError, overflow OverflowError, bad_alloc MemoryError, other
# std::exception RuntimeError) and an exception that is not a std::exception at all.
EXCEPTIONS = [("invalid_argument", ValueError, "{who}: bad value{where}"),
              ("out_of_range", IndexError, "{who}: index out of range{where}"),
              ("runtime_error", RuntimeError, "{who}: failure{where}"),
              ("domain_error", ValueError, "{who}: outside the domain{where}"),
              ("overflow_error", OverflowError, "{who}: too large{where}"),
              ("logic_error", RuntimeError, "{who}: broken logic{where}"),
              ("bad_alloc", MemoryError, "std::bad_alloc"),
              ("not_std", RuntimeError, "[Uu]nknown (C\\+\\+ )?exception")]


@pytest.mark.parametrize("kind,exc,text", EXCEPTIONS)
def test_backward_exceptions_become_python_exceptions(autograd_ops, kind, exc, text):
    with pytest.raises(exc, match=text.format(who="Misbehave", where=" in Backward")) as info:
        _misbehave(autograd_ops, kind)
    assert type(info.value) is exc


@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("kind,exc,text", EXCEPTIONS)
def test_failed_forward_raises_and_records_nothing(autograd_ops, kind, exc, text, grad):
    """FailingForward marks x dirty, writes nothing, and raises. A recording call (grad) sees by x's
    checksum that nothing changed; a call that takes no checksum counts the write MarkDirty declared (a
    tensor saved from x then fails its check: an error, never a gradient of other values)."""
    x = nonleaf(3) if grad else T(3)
    node, version = x._node, x._version
    with pytest.raises(exc, match=text.format(who="FailingForward", where="")) as info:
        autograd_ops.failing_forward(x, kind)
    assert type(info.value) is exc
    assert x._node is node and x._version == version + (0 if grad else 1) and x.requires_grad == grad
    assert rt.is_grad_enabled()


# ---- higher order ----------------------------------------------------------------------
def test_higher_order_gradient_through_a_cpp_function_names_it(autograd_ops):
    f = lambda t: autograd_ops.mul_saved(t, t).sum()  # noqa: E731
    np.testing.assert_allclose(rt.grad(f)(Tensor(np.array([1.0, 2.0]))).asnumpy(), [2.0, 4.0])
    with pytest.raises(RuntimeError, match="MulSaved is once-differentiable"):
        rt.grad(rt.grad(f))(Tensor(np.array([1.0, 2.0])))


def test_higher_order_gradient_not_through_the_cpp_function_works(autograd_ops):
    # the inner gradient of sin(x) * c, where c comes from a C++ op on a constant: d2/dx2 = -sin(x) * c
    c = Tensor(np.array([2.0, 3.0]))

    def f(x):
        return (F.sin(x) * autograd_ops.mul_saved(c, c)).sum()

    x = Tensor(np.array([0.5, 1.0]))
    np.testing.assert_allclose(rt.grad(rt.grad(f))(x).asnumpy(), -np.sin(x.asnumpy()) * c.asnumpy() ** 2)


# ---- compositions with built-in ops -------------------------------------------------------
def test_random_compositions_with_builtin_ops_and_broadcasting(autograd_ops, my_ops):
    ops1 = [F.tanh, F.sin, lambda t: autograd_ops.exp_saves_output(t * 0.3),
            lambda t: autograd_ops.two_scales(t, True)[1], lambda t: autograd_ops.square_and_sign(t)[0]]
    ops2 = [F.add, my_ops.mul, lambda a, b: F.sub(a, b),
            lambda a, b: autograd_ops.mul_saved(*[F.broadcast_to(t, np.broadcast_shapes(a.shape, b.shape))
                                                  for t in (a, b)])]
    local = np.random.default_rng(17)
    shapes = [(2, 3), (3,), (2, 1), ()]
    for trial in range(12):
        xs = [Tensor(local.standard_normal(shapes[i])) for i in local.integers(0, len(shapes), 3)]
        seq = [(local.integers(len(ops1)), local.integers(len(ops2)), local.integers(3)) for _ in range(4)]

        def f(a, b, c, seq=seq):
            vals, h = [a, b, c], a
            for u, v, k in seq:
                h = ops2[v](ops1[u](h), vals[k])
            return h

        assert rt.gradcheck(f, xs), f"trial {trial}: {seq}"


def test_full_write_check_catches_a_single_byte_in_a_large_argument(autograd_ops, cache_dir):
    """OPBUILDER_CHECK_WRITES=full hashes every byte (read once per process: run in a child)."""
    import subprocess
    import sys
    import textwrap
    from pathlib import Path
    src = Path(__file__).resolve().parent / "cpp" / "autograd_ops.cpp"
    code = textwrap.dedent(f"""
        import numpy as np, runtime as rt
        from opbuilder import CustomOpBuilder
        m = CustomOpBuilder("autograd_ops", [{str(src)!r}]).load()
        x = rt.Tensor(np.ones(1 << 20), requires_grad=True) * 1
        try:
            m.sneaky_scale(x, "one_middle")
        except RuntimeError as e:
            print("caught:", e)

        class Sneaky(rt.autograd.Function):
            @staticmethod
            def forward(ctx, a):
                a.asnumpy().view(np.uint8)[a.asnumpy().nbytes // 2 + 3] ^= 1
                return a * 2

            @staticmethod
            def backward(ctx, g):
                return g * 2

        try:
            Sneaky.apply(rt.Tensor(np.ones(1 << 20), requires_grad=True) * 1)
        except RuntimeError as e:
            print("caught:", e)
    """)
    env = dict(os.environ, OPBUILDER_CHECK_WRITES="full", OPBUILDER_CACHE_DIR=str(cache_dir))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == 2, res.stdout
    assert "SneakyScale::Forward modified argument 0 in place without MarkDirty" in lines[0]
    assert "Sneaky.forward modified argument 0 in place without mark_dirty" in lines[1]


# ---- plain values among the arguments ------------------------------------------------------
def test_double_and_int_vector_arguments_and_needs_input_grad_by_forward_position(autograd_ops):
    rng = np.random.default_rng(4)
    x, y = Tensor(rng.standard_normal((2, 3))), Tensor(rng.standard_normal((2, 3)))
    out = autograd_ops.mixed_args(0.5, x, [3, -2], y)
    np.testing.assert_allclose(out.asnumpy(), 1.5 * x.asnumpy() - 2 * y.asnumpy())
    assert autograd_ops.mixed_needs() == [False, False, False, False] and not out.requires_grad
    # positions count every Forward argument: x is 1 and y is 3, not 0 and 1
    autograd_ops.mixed_args(0.5, Tensor(x.asnumpy(), requires_grad=True), [3, -2], y)
    assert autograd_ops.mixed_needs() == [False, True, False, False]
    autograd_ops.mixed_args(0.5, x, [3, -2], Tensor(y.asnumpy(), requires_grad=True))
    assert autograd_ops.mixed_needs() == [False, False, False, True]
    assert rt.gradcheck(lambda a, b: autograd_ops.mixed_args(0.5, a, [3, -2], b), [x, y])
    gx = rt.grad(lambda a: autograd_ops.mixed_args(0.5, a, [3, -2], y).sum())(x)
    np.testing.assert_allclose(gx.asnumpy(), np.full((2, 3), 1.5))
    with pytest.raises(ValueError, match="MixedArgs: w must have two entries"):
        autograd_ops.mixed_args(0.5, x, [3], y)


@pytest.mark.parametrize("flag", [None, 5, 0, np.float64(0.5), 1.0, np.bool_(True)])
def test_a_bool_argument_takes_true_or_false_only_on_both_layers(autograd_ops, flag):
    """pybind11's caster took any object by its truth (None as False, 5 or numpy.float64(0.5) as True:
    another result, silently); nanobind's, like torch's, takes True or False (attack on 30a3d5f)."""
    x = T(3)
    with pytest.raises(TypeError, match=r"^two_scales\(\): incompatible function arguments"):
        autograd_ops.two_scales(x, flag)
    for materialize in (True, False):
        a, b = autograd_ops.two_scales(x, materialize)
        assert a.shape == b.shape == (3,)


@pytest.mark.parametrize("flag", [5, np.float64(0.5), 1.0, np.bool_(True)])
def test_a_bool_in_an_optional_or_a_list_takes_true_or_false_only(autograd_ops, flag):
    """std::optional<bool> and std::vector<bool> parameters took their values by truth on pybind11 (attack on
    efab221); nanobind's casters refuse them."""
    x = T(3)
    with pytest.raises(TypeError, match=r"^scale_if_optional\(\): incompatible function arguments"):
        autograd_ops.scale_if_optional(x, flag)
    with pytest.raises(TypeError, match=r"^scale_if_any\(\): incompatible function arguments"):
        autograd_ops.scale_if_any(x, [False, flag])
    np.testing.assert_array_equal(autograd_ops.scale_if_optional(x, None).asnumpy(), x.asnumpy())
    np.testing.assert_array_equal(autograd_ops.scale_if_optional(x, True).asnumpy(), 2 * x.asnumpy())
    # (pybind11 got False as an engaged true: the optional's has_value, attack on 98bd310)
    np.testing.assert_array_equal(autograd_ops.scale_if_optional(x, False).asnumpy(), 3 * x.asnumpy())
    np.testing.assert_array_equal(autograd_ops.scale_if_any(x, [False, False]).asnumpy(), x.asnumpy())
    np.testing.assert_array_equal(autograd_ops.scale_if_any(x, [False, True]).asnumpy(), 2 * x.asnumpy())
    np.testing.assert_array_equal(autograd_ops.scale_if_any(x, []).asnumpy(), x.asnumpy())


@pytest.mark.parametrize("stored, read, k", [("double", "double", 2.5), ("int", "int", 3.0), ("int", "double", 3.0),
                                           ("bool", "bool", 100.0), ("string", "string", 3.0),
                                           ("np_float32", "float", 2.5), ("np_float32", "double", 2.5),
                                           ("np_bool", "bool", 100.0), ("bool", "optional_bool", 100.0),
                                           ("np_bool", "optional_bool", 100.0), ("int", "uint8", 3.0)])
def test_saved_data_reads_back_what_was_stored(autograd_ops, stored, read, k):
    g = rt.grad(lambda a: autograd_ops.saved_read_as(a, stored, read).sum())(T(3))
    np.testing.assert_array_equal(g.asnumpy(), np.full(3, k))


@pytest.mark.parametrize("stored, read, as_", [
    ("double", "bool", "bool"), ("int", "bool", "bool"), ("double", "int", "an integer type"),
    ("bool", "int", "an integer type"), ("bool", "double", "a floating type"), ("string", "int", "an integer type"),
    ("double", "string", "std::string"), ("double", "optional_bool", "bool"), ("doubles", "bools", "bool"),
    ("np_array_true", "double", "a floating type"), ("np_array_true", "int", "an integer type")])
def test_saved_data_read_as_another_type_is_a_type_error_on_both_layers(autograd_ops, stored, read, as_):
    """pybind11 read a stored 2.5 as bool by its truth (a gradient 100x, silently) and nanobind refused
    with a bare "std::bad_cast" (attack on 30a3d5f): now one TypeError on both layers, naming both types."""
    py_type = {"double": "float", "int": "int", "bool": "bool", "string": "str", "doubles": "float",
               "np_array_true": "numpy.ndarray"}[stored]
    with pytest.raises(TypeError, match=rf"^saved_data: a stored {py_type} cannot be read as {as_} \(a bool reads "
                                        r"back as bool, an int as an integer or floating type, a float as a "
                                        r"floating type, a str as std::string\)"):
        rt.grad(lambda a: autograd_ops.saved_read_as(a, stored, read).sum())(T(3))


@pytest.mark.parametrize("stored, read, py_type", [("tensor", "tensors", "Tensor"), ("string", "char", "str")])
def test_saved_data_what_neither_layer_reads_is_one_type_error(autograd_ops, stored, read, py_type):
    """A stored tensor read as a list of tensors gave its rows on pybind11 (it takes any sequence); "two" read
    as char, pybind11's ValueError (attack on 98bd310): one TypeError on both layers."""
    with pytest.raises(TypeError, match=rf"^saved_data: a stored {py_type} cannot be read as the type asked for "
                                        r"\(a bool reads back as bool"):
        rt.grad(lambda a: autograd_ops.saved_read_as(a, stored, read).sum())(T(3))


def test_saved_data_an_int_read_as_a_type_it_does_not_fit_is_a_type_error(autograd_ops):
    """300 read as uint8: nanobind's bare "std::bad_cast", pybind11's "Unable to cast" (attack on efab221)."""
    with pytest.raises(TypeError, match=r"^saved_data: a stored int, 300, does not fit the unsigned integer type of "
                                        r"8 bits read$"):
        rt.grad(lambda a: autograd_ops.saved_read_as(a, "int300", "uint8").sum())(T(3))


def test_a_dimension_out_of_range_is_an_index_error_naming_it(autograd_ops):
    """Tensor::shape(dim) with dim out of range: vector::_M_range_check's message with the dim as a huge
    unsigned number (attack on 30a3d5f); now an IndexError naming the dim and the range, as torch's."""
    x = T(4)
    assert (autograd_ops.dim_size(x, 0), autograd_ops.dim_size(x, -1)) == (4, 4)
    assert autograd_ops.dim_size(T(2, 5), -1) == 5 and autograd_ops.dim_size(T(2, 5), -2) == 2
    for d in (-2, 1, -3):
        with pytest.raises(IndexError, match=rf"^opbuilder::Tensor::shape\({d}\): dimension out of range for a 1-d "
                                             r"tensor \(expected -1 to 0\)$"):
            autograd_ops.dim_size(x, d)
    with pytest.raises(IndexError, match=r"shape\(0\): dimension out of range for a 0-d tensor \(expected none\)$"):
        autograd_ops.dim_size(Tensor(np.float64(1.0)), 0)


# ---- std::optional<TensorPtr> and TensorPtrList arguments ------------------------------
def test_an_optional_tensor_argument_needs_and_gets_a_gradient(autograd_ops):
    x, y, b = T(2, 3), T(2, 3), T(2, 3)
    # it was no tensor to Apply: NeedGrad false, no edge, and its gradient refused as "not a tensor"
    assert rt.gradcheck(lambda a, c, d: autograd_ops.mul_opt_bias(a, c, d), [x, y, b])
    rt.grad(lambda a, c, d: autograd_ops.mul_opt_bias(a, c, d).sum(), grad_position=(0, 1, 2))(x, y, b)
    assert autograd_ops.opt_needs() == [True, True, True, True]
    gb = rt.grad(lambda d: autograd_ops.mul_opt_bias(x, y, b=d).sum())(b)
    np.testing.assert_array_equal(gb.asnumpy(), np.ones((2, 3)))
    assert autograd_ops.opt_needs() == [False, False, True, True]
    assert rt.gradcheck(lambda a, c: autograd_ops.mul_opt_bias(a, c), [x, y])  # left out: None
    rt.grad(lambda a: autograd_ops.mul_opt_bias(a, y).sum())(x)
    assert autograd_ops.opt_needs() == [True, False, False, False]
    strided = Tensor(rng.standard_normal((3, 2)), requires_grad=True).T  # a view reaches Forward as a copy
    gs = rt.grad(lambda d: (autograd_ops.mul_opt_bias(x, y, d) * 3).sum())(strided)
    np.testing.assert_array_equal(gs.asnumpy(), np.full((2, 3), 3.0))


def test_a_tensor_in_a_list_argument_that_requires_grad_is_an_error_not_a_zero_gradient(autograd_ops):
    x, b = T(3), T(3)
    np.testing.assert_allclose(autograd_ops.sum_list(x, [b, b]).asnumpy(), x.asnumpy() + 2 * b.asnumpy())
    gx = rt.grad(lambda a: autograd_ops.sum_list(a, [b]).sum())(x)  # the list needs no gradient: fine
    np.testing.assert_array_equal(gx.asnumpy(), np.ones(3))
    with pytest.raises(RuntimeError, match=r"SumList: argument 1 is a list of tensors and its element 1 requires "
                                           r"grad, but Function<T> gives gradients to TensorPtr arguments only"):
        rt.grad(lambda a, c: autograd_ops.sum_list(a, [b, c]).sum(), grad_position=(0, 1))(x, b)
    with pytest.raises(RuntimeError, match="SumList: argument 1 is a list of tensors"):  # even with x needing none
        rt.grad(lambda c: autograd_ops.sum_list(x, [c]).sum())(b)
    with rt.no_grad():  # nothing recorded: no gradient asked for
        out = autograd_ops.sum_list(x, [Tensor(b.asnumpy(), requires_grad=True)])
    np.testing.assert_allclose(out.asnumpy(), x.asnumpy() + b.asnumpy())
