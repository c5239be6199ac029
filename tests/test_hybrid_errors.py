"""Every construct outside the hybrid DSL is an error naming it and the file:line it is on, raised when the
op is made (or, for type errors, when it is first built for some dtypes), never a crash. Nothing here
compiles but the deepest nesting the DSL accepts: each error comes before code generation or the build."""
import importlib.util
import inspect
import re

import numpy as np
import pytest

import runtime as rt
from runtime import Tensor, ops
from runtime.hybrid import HybridSyntaxError, HybridTypeError, kernel
from runtime.hybrid.source import MAX_NESTING

HERE = __file__
NOT_A_CONSTANT = [1, 2]


def _line(func, marker="# <-"):
    lines, start = inspect.getsourcelines(func)
    return start + next(k for k, text in enumerate(lines) if marker in text)


def k_while(x):
    y = output_tensor(x.shape, x.dtype)
    i = 0
    while i < 3:  # <-
        i += 1
    return y


def k_break(x):
    y = output_tensor(x.shape, x.dtype)
    for i in range(3):
        break  # <-
    return y


def k_continue(x):
    y = output_tensor(x.shape, x.dtype)
    for i in range(3):
        continue  # <-
    return y


def k_unknown_call(x):
    y = output_tensor(x.shape, x.dtype)
    for i in range(x.shape[0]):
        y[i] = softplus(x[i])  # <-  # noqa: F821
    return y


def k_module_call(x):
    y = output_tensor(x.shape, x.dtype)
    for i in range(x.shape[0]):
        y[i] = np.sqrt(x[i])  # <-
    return y


def k_attribute(x):
    y = output_tensor(x.shape, x.dtype)
    for i in range(x.size):  # <-
        y[i] = x[i]
    return y


def k_recursion(x):
    y = output_tensor(x.shape, x.dtype)
    for i in range(x.shape[0]):
        y[i] = k_recursion(x)  # <-
    return y


def k_with(x):
    y = output_tensor(x.shape, x.dtype)
    with open("f"):  # <-
        pass
    return y


def k_try(x):
    y = output_tensor(x.shape, x.dtype)
    try:  # <-
        y[0] = x[0]
    except IndexError:
        pass
    return y


def k_lambda(x):
    y = output_tensor(x.shape, x.dtype)
    f = lambda v: v  # <-  # noqa: E731
    return y


def k_comprehension(x):
    y = output_tensor(x.shape, x.dtype)
    s = [x[i] for i in range(3)]  # <-
    return y


def k_nested_def(x):
    y = output_tensor(x.shape, x.dtype)

    def inner(v):  # <-
        return v
    return y


def k_write_input(x):
    y = output_tensor(x.shape, x.dtype)
    x[0] = 1.0  # <-
    return y


def k_decl_in_loop(x):
    for i in range(2):
        y = output_tensor(x.shape, x.dtype)  # <-
    return y


def k_no_return(x):
    y = output_tensor(x.shape, x.dtype)
    y[0] = x[0]  # <-


def k_return_input(x):
    y = output_tensor(x.shape, x.dtype)
    return x  # <-


def k_keywords(x):
    y = output_tensor(x.shape, x.dtype)
    for i in range(x.shape[0]):
        y[i] = max(x[i], 0, key=abs)  # <-
    return y


def k_global_object(x):
    y = output_tensor(x.shape, x.dtype)
    for i in range(x.shape[0]):
        y[i] = x[i] * NOT_A_CONSTANT  # <-
    return y


def k_for_else(x):
    y = output_tensor(x.shape, x.dtype)
    for i in range(3):  # <-
        y[i] = x[i]
    else:
        y[0] = 0
    return y


def k_loop_over_list(x):
    y = output_tensor(x.shape, x.dtype)
    for i in [0, 1]:  # <-
        y[i] = x[i]
    return y


def k_unpacking(x):
    y = output_tensor(x.shape, x.dtype)
    a, b = 1, 2  # <-
    return y


def k_slice(x):
    y = output_tensor(x.shape, x.dtype)
    y[0] = x[1:3]  # <-
    return y


def k_assign_tensor(x):
    y = output_tensor(x.shape, x.dtype)
    y = x  # <-
    return y


def k_defaults(x, scale=2.0):  # <-
    y = output_tensor(x.shape, x.dtype)
    return y


def k_matmul_operator(x):
    y = output_tensor(x.shape, x.dtype)
    y[0] = x[0] @ x[1]  # <-
    return y


def k_in(x):
    y = output_tensor(x.shape, x.dtype)
    if x[0] in (1, 2):  # <-
        y[0] = 1
    return y


def k_loop_index_after_loop(x):
    y = output_tensor(x.shape, x.dtype)
    for i in range(x.shape[0]):
        y[i] = x[i]
    y[0] = x[i]  # <-
    return y


def k_grid_index_after_loop(x):
    y = output_tensor(x.shape, x.dtype)
    for g in grid(x.shape):
        y[g] = x[g]
    for i in range(2):
        y[g] = 0  # <-
    return y


SYNTAX = [
    (k_while, r"'while' loops are not supported"),
    (k_break, r"'break' are not supported"),
    (k_continue, r"'continue' are not supported"),
    (k_unknown_call, r"call to unknown function 'softplus'; the DSL's functions are .*sqrt"),
    (k_module_call, r"calls to np.sqrt are not supported; use the DSL's own functions"),
    (k_attribute, r"the attribute '.size' is not supported \(only .shape and .dtype of tensors\)"),
    (k_recursion, r"recursion: kernel 'k_recursion' calls itself"),
    (k_with, r"'with' blocks are not supported"),
    (k_try, r"'try' blocks are not supported"),
    (k_lambda, r"lambdas are not supported"),
    (k_comprehension, r"list comprehensions are not supported"),
    (k_nested_def, r"nested functions are not supported"),
    (k_write_input, r"'x' is an input; inputs are read-only"),
    (k_decl_in_loop, r"output_tensor\(...\) must be at the top level of the kernel"),
    (k_no_return, r"a hybrid kernel ends with 'return' of its output tensor"),
    (k_return_input, r"return the output tensors by name"),
    (k_keywords, r"max takes no keyword arguments"),
    (k_global_object, r"'NOT_A_CONSTANT' is a list from outside the kernel; only int, float and bool constants"),
    (k_for_else, r"'for ... else' is not supported"),
    (k_loop_over_list, r"a loop runs over range\(...\) or a hint"),
    (k_unpacking, r"assign one target at a time"),
    (k_slice, r"slices \(index elements one at a time\) are not supported"),
    (k_assign_tensor, r"'y' is a tensor; assign to its elements"),
    (k_defaults, r"kernel parameters must be plain positional names"),
    (k_matmul_operator, r"the operator MatMult is not supported"),
    (k_in, r"the comparison In is not supported"),
    (k_loop_index_after_loop, r"loop index 'i' is read after its loop \(line \d+\) ended; inside the loop, copy "
                              r"it into a scalar"),
    (k_grid_index_after_loop, r"loop index 'g' is read after its loop \(line \d+\) ended"),
]


@pytest.mark.parametrize("func,message", SYNTAX, ids=[f.__name__ for f, _ in SYNTAX])
def test_unsupported_construct_names_file_and_line(func, message):
    where = re.escape(f"{HERE}:{_line(func)}: ")
    with pytest.raises(HybridSyntaxError, match=where + message + rf".*\(in hybrid kernel '{func.__name__}'\)"):
        ops.Custom(func, func_type="akg")
    with pytest.raises(SyntaxError, match=where):  # a SyntaxError, whatever the target
        kernel(func, target="python")(np.ones(3))


def k_rank(x):
    y = output_tensor(x.shape, x.dtype)
    for i in range(x.shape[0]):
        y[i] = x[i]  # <-
    return y


def k_float_index(x):
    y = output_tensor(x.shape, x.dtype)
    for i in range(x.shape[0]):
        y[i] = x[i / 2]  # <-
    return y


def k_bool_arith(x):
    y = output_tensor(x.shape, "bool")
    for i in range(x.shape[0]):
        y[i] = (x[i] > 0) + (x[i] < 1)  # <-
    return y


def k_tensor_value(x):
    y = output_tensor(x.shape, x.dtype)
    for i in range(x.shape[0]):
        y[i] = x  # <-
    return y


def k_unassigned(x):
    y = output_tensor(x.shape, x.dtype)
    for i in range(x.shape[0]):
        s = s + x[i]  # <-
        y[i] = s
    return y


TYPES = [
    (k_rank, (np.ones((2, 2), np.float32),), r"'x' has rank 2 but is indexed with 1 index"),
    (k_float_index, (np.ones(3, np.float32),), r"an index must be an integer, got float64 \(i / 2\)"),
    (k_bool_arith, (np.ones(3, np.float32),), r"arithmetic on two bool values"),
    (k_tensor_value, (np.ones(3, np.float32),), r"'x' is a tensor of rank 1; index it"),
    (k_unassigned, (np.ones(3, np.float32),), r"scalar 's' is used before it is assigned"),
]


@pytest.mark.parametrize("func,inputs,message", TYPES, ids=[f.__name__ for f, _, _ in TYPES])
def test_type_errors_name_file_and_line_at_the_first_build(func, inputs, message):
    op = ops.Custom(func, func_type="hybrid")  # the structure is fine; the types are known at the call
    with pytest.raises(HybridTypeError, match=re.escape(f"{HERE}:{_line(func)}: ") + message):
        op(*[Tensor(a) for a in inputs])


def k_data_dependent_shape(x):
    n = int(x[0])  # <-
    y = output_tensor((n,), x.dtype)
    for i in range(n):
        y[i] = x[i]
    return y


def k_copy(x):
    y = output_tensor(x.shape, x.dtype)
    for i in range(x.shape[0]):
        y[i] = x[i]
    return y


def test_an_output_shape_that_needs_tensor_values_asks_for_out_shape():
    x = Tensor(np.array([2.0, 5.0, 7.0], np.float32))
    with pytest.raises(HybridTypeError, match=rf"{re.escape(HERE)}:{_line(k_data_dependent_shape) + 1}: the output "
                                              rf"shapes cannot be inferred: 'n' \(line "
                                              rf"{_line(k_data_dependent_shape)}\) is not computed from the input "
                                              rf"shapes alone.*pass out_shape"):
        ops.Custom(k_data_dependent_shape, func_type="hybrid")(x)


def test_out_specs_that_disagree_with_the_declarations_are_value_errors():
    x = Tensor(np.ones(3, np.float32))
    with pytest.raises(ValueError, match=r"Custom 'k_copy': output 0 has out_dtype float64 but the kernel declares "
                                         r"float32 \(output_tensor\)"):
        ops.Custom(k_copy, out_shape=[3], out_dtype=rt.float64, func_type="hybrid")(x)
    with pytest.raises(ValueError, match=r"Custom 'k_copy': output 0 has out_shape \[4\] but the kernel declares "
                                         r"\[3\] \(output_tensor\) for inputs of shapes \[\[3\]\]"):
        ops.Custom(k_copy, out_shape=lambda s: [4], out_dtype=lambda d: d, func_type="hybrid")(x)
    with pytest.raises(TypeError, match=r"Custom 'k_copy': hybrid kernel takes 1 inputs \(x\), got 2"):
        ops.Custom(k_copy, func_type="hybrid")(x, x)


def test_build_options_and_non_functions_are_refused():
    with pytest.raises(ValueError, match=r"include_paths, cflags and ldflags build an aot source; hybrid kernel "
                                         r"'k_copy' is generated"):
        ops.Custom(k_copy, func_type="hybrid", cflags=["-O3"])
    with pytest.raises(TypeError, match=r"a hybrid kernel is a Python function, got str"):
        ops.Custom("lib.so:f", func_type="akg")
    with pytest.raises(HybridSyntaxError, match=r"must be a function defined with def"):
        ops.Custom(lambda x: x, func_type="hybrid")


def data_sized(x):
    n = int(x[0])
    y = output_tensor((n,), x.dtype)
    for i in range(n):
        y[i] = 7.0
    return y


@pytest.mark.build
def test_an_output_sized_from_data_must_match_out_shape_before_anything_is_written():
    op = ops.Custom(data_sized, out_shape=(2,), out_dtype=rt.float32, func_type="hybrid")
    np.testing.assert_array_equal(op(Tensor(np.array([2.0], np.float32))).asnumpy(), [7.0, 7.0])
    line = inspect.getsourcelines(data_sized)[1] + 2
    with pytest.raises(RuntimeError, match=rf"test_hybrid_errors\.py:{line}: output 'y' is declared with shape "
                                           rf"\(200000,\) here, but was allocated as \(2,\) \(out_shape\): make "
                                           rf"them agree"):
        op(Tensor(np.array([200000.0], np.float32)))  # the loops would have written 200000 floats into 2


def bool_max(a):
    c = output_tensor(a.shape, "float64")
    for i in range(a.shape[0]):
        c[i] = float64(max(a[i], a[i]))
    return c


def test_max_min_power_of_bools_is_a_type_error_naming_the_line():
    line = inspect.getsourcelines(bool_max)[1] + 3
    with pytest.raises(HybridTypeError, match=rf"test_hybrid_errors\.py:{line}: max\(\) of bool values is not "
                                              rf"supported; cast them first"):
        ops.Custom(bool_max, func_type="hybrid")(Tensor(np.array([True, False])))


def _long_sums(directory, terms):
    """A module with a kernel whose one statement sums ``terms`` elements, and one calling it (inlined)."""
    path = directory / f"long_sum_{terms}.py"
    path.write_text("def long_sum(x):\n"
                    "    y = output_tensor(x.shape, x.dtype)\n"
                    "    for i in range(x.shape[0]):\n"
                    f"        y[i] = {' + '.join(['x[i] * 0.5'] + ['x[i]'] * (terms - 1))}\n"
                    "    return y\n\n\n"
                    "def calls_long_sum(x):\n"
                    "    y = long_sum(x)\n"
                    "    return y\n")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, str(path)


def test_an_expression_nested_too_deep_is_a_syntax_error_naming_its_line_in_both_targets(tmp_path):
    """A sum of 400 terms is nested 400 levels deep: each step after parsing walks the tree recursively, and the
    generator ran out of Python's recursion limit (a bare RecursionError) while the Python target ran it."""
    mod, path = _long_sums(tmp_path, 400)
    message = re.escape(f"{path}:4: statements and expressions are nested more than {MAX_NESTING} levels deep here "
                        f"(a sum of n terms is about n levels); the hybrid DSL takes at most {MAX_NESTING}: split "
                        f"the expression into several statements (s = a + b, then s = s + c, ...) (in hybrid "
                        f"kernel 'long_sum')")
    x = np.ones(3, np.float32)
    for func in (mod.long_sum, mod.calls_long_sum):
        with pytest.raises(HybridSyntaxError, match="^" + message + "$"):
            ops.Custom(func, func_type="hybrid")
        with pytest.raises(HybridSyntaxError, match="^" + message + "$"):
            kernel(func)(x)
        with pytest.raises(HybridSyntaxError, match="^" + message + "$"):
            kernel(func).source(x)


@pytest.mark.build
def test_the_deepest_nesting_accepted_builds_and_agrees_with_the_python_target(tmp_path):
    """MAX_NESTING levels leave room on Python's stack for every step, the inlining of a called function's body
    (copy.deepcopy) included; one level more is refused. Levels here: the loop, the assignment, one per '+',
    the '*', the element x[i] and its names: a sum of MAX_NESTING - 4 terms is MAX_NESTING levels."""
    from runtime.hybrid import build_together
    mod, path = _long_sums(tmp_path, MAX_NESTING - 4)
    x = np.arange(4, dtype=np.float64) - 1.5
    ks = [kernel(mod.long_sum), kernel(mod.calls_long_sum)]
    build_together([(k, (("float64", 1),)) for k in ks])
    for k in ks:
        np.testing.assert_array_equal(ops.Custom(k)(Tensor(x)).asnumpy(), k(x))
    deeper, _ = _long_sums(tmp_path, MAX_NESTING - 3)
    with pytest.raises(HybridSyntaxError, match=f"nested more than {MAX_NESTING} levels deep"):
        kernel(deeper.calls_long_sum).check()
