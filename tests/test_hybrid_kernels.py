"""Hybrid DSL kernels compiled to C++ agree with the same functions run by the Python target (numpy).

Three kernels cover the DSL (1-D, 2-D, 3-D; intrinsics, if/elif/else, temporaries, reductions, several
outputs, grid loops, loop hints, shape-inferred outputs); each is built once per dtype it is checked in.
"""
import numpy as np
import pytest

import runtime as rt
from runtime import Tensor, ops
from runtime.hybrid import HybridKernel, kernel

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)

EPS = 0.5  # a constant from the module, baked into the generated code


@kernel
def elementwise(x, y):
    z = output_tensor(x.shape, x.dtype)
    flags = output_tensor(x.shape, "int32")
    for i in vectorize(x.shape[0]):
        a = x[i]
        b = y[i]
        if a > b:
            z[i] = a - b * 2
            flags[i] = 1
        elif a == b:
            z[i] = max(a, b, 0)
            flags[i] = 0
        else:
            z[i] = min(abs(a), abs(b)) + sign(a)
            flags[i] = -1
        if not (a > 0 and b > 0) or a == 0:
            z[i] += 1
    return z, flags


@kernel
def matmul_stats(a, b):
    m = a.shape[0]
    n = b.shape[1]
    c = output_tensor((m, n), a.dtype)
    rowmax = output_tensor((m,), "float64")
    col = allocate((n,), "float64")
    for j in range(n):
        col[j] = 0.0
    for i in parallel(m):
        best = -1e300
        for j in range(n):
            acc = 0.0
            for k in reduce(a.shape[1]):
                acc = acc + a[i, k] * b[k, j]
            c[i, j] = acc
            col[j] += float(acc)
            best = max(best, float(acc))
        rowmax[i] = best + col[0] * 0
    return c, rowmax


@kernel
def volume(x):
    out = output_tensor(x.shape, "float64")
    idx = output_tensor((x.shape[0], x.shape[-1]), "int64")
    for g in grid(x.shape):
        v = float64(x[g])
        out[g] = sqrt(abs(v)) + exp(-abs(v) * EPS) + floor(v / 3) + (v // 2) + (v % 3) + tanh(v) + erf(v)
        out[g] += power(abs(v), 2) * 0.001 + (1.0 if g[1] % 2 == 0 else -1.0)
    for i in range(x.shape[0]):
        for k in serial(x.shape[2] - 1, -1, -1):
            count = 0
            for j in range(x.shape[1]):
                if x[i, j, k] >= x[i, 0, k] and j != 0:
                    count += 1
            idx[i, k] = count * 10 + (i ^ k) + (k << 1)
    return out, idx


def _rand(rng, shape, dtype):
    if np.dtype(dtype).kind == "f":
        return (rng.standard_normal(shape) * 3).astype(dtype)
    return rng.integers(-9, 10, shape).astype(dtype)


def _tol(dtype):
    return {"float16": dict(rtol=2e-2, atol=2e-2), "float32": dict(rtol=1e-4, atol=1e-4)}.get(
        np.dtype(dtype).name, dict(rtol=1e-9, atol=1e-9))


def _compare(k, *inputs, dtype="float64"):
    got = ops.Custom(k)(*[Tensor(i) if isinstance(i, np.ndarray) else i for i in inputs])
    want = k(*inputs)  # the Python target
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        g = g.asnumpy()
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), **_tol(dtype))
    return got


DTYPES = ["float16", "float32", "float64", "int32"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_1d_branches_and_intrinsics_match_the_python_target(dtype):
    rng = np.random.default_rng(1)
    x = _rand(rng, 37, dtype)
    y = _rand(rng, 37, dtype)
    y[:5] = x[:5]  # the elif branch
    x[5] = 0
    _compare(elementwise, x, y, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_2d_reduction_temporaries_and_two_outputs_match(dtype):
    rng = np.random.default_rng(2)
    a = _rand(rng, (5, 7), dtype)
    b = _rand(rng, (7, 3), dtype)
    c, rowmax = _compare(matmul_stats, a, b, dtype=dtype)
    if dtype != "float16":
        np.testing.assert_allclose(c.asnumpy().astype(np.float64), a.astype(np.float64) @ b.astype(np.float64),
                                   **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_3d_grid_loops_and_integer_ops_match(dtype):
    rng = np.random.default_rng(3)
    x = _rand(rng, (3, 4, 5), dtype)
    _compare(volume, x, dtype=dtype)


def test_a_new_shape_and_views_reuse_the_same_library():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 4)).astype(np.float32)
    _compare(elementwise, x[:, 0].copy(), x[:, 1].copy(), dtype="float32")
    first = elementwise.compiled((("float32", 1), ("float32", 1)))
    # a strided column and a broadcast view: other shapes and layouts, the same specialization
    _compare(elementwise, x[::2, 1], np.broadcast_to(x[0, 2], (3,)), dtype="float32")
    _compare(elementwise, x[:0, 1], x[:0, 2], dtype="float32")  # empty
    assert elementwise.compiled((("float32", 1), ("float32", 1))) is first
    # a transposed 2-D input
    a = rng.standard_normal((7, 5)).astype(np.float64)
    _compare(matmul_stats, a.T, a, dtype="float64")


def test_output_shapes_are_inferred_from_output_tensor_without_running_loops():
    assert matmul_stats.output_specs([(5, 7), (7, 3)], [np.float32, np.float32]) == [
        ((5, 3), "float32"), ((5,), "float64")]
    assert volume.output_specs([(2, 3, 4)], [np.int32]) == [((2, 3, 4), "float64"), ((2, 4), "int64")]
    c, rowmax = ops.Custom(matmul_stats)(Tensor(np.ones((2, 3), np.float32)), Tensor(np.ones((3, 4), np.float32)))
    assert c.shape == (2, 4) and c.dtype == rt.float32 and rowmax.shape == (2,) and rowmax.dtype == rt.float64


def test_given_out_shape_and_dtype_are_used_when_they_agree():
    op = ops.Custom(elementwise, out_shape=lambda x, y: [x, x], out_dtype=lambda x, y: [x, rt.int32],
                    func_type="hybrid")
    z, flags = op(Tensor(np.array([1.0, 2.0])), Tensor(np.array([2.0, 2.0])))
    np.testing.assert_array_equal(flags.asnumpy(), [-1, 0])


def test_rank0_inputs_are_scalars_and_an_int_input_promotes_like_numpy():
    @kernel
    def scale(x, s):
        y = output_tensor(x.shape, x.dtype)
        for i in range(x.shape[0]):
            y[i] = x[i] * s + s[()] / 2
        return y

    x = np.arange(4, dtype=np.float32)
    got = _compare(scale, x, np.array(3, np.int32), dtype="float32")[0]
    assert got.dtype == rt.float32  # float32 * int32 is computed in float64 (numpy), stored into float32 y
    np.testing.assert_allclose(got.asnumpy(), x * 3 + 1.5)


def test_python_target_by_decorator_and_by_environment(monkeypatch):
    def traced(x):
        y = output_tensor(x.shape, x.dtype)
        for i in range(x.shape[0]):
            y[i] = x[i] + 1
        return y

    k = kernel(traced, target="python")
    assert k.target == "python"
    out = ops.Custom(k)(Tensor(np.array([1.0, 2.0], np.float32)))
    np.testing.assert_array_equal(out.asnumpy(), [2.0, 3.0])
    assert k._built == {}  # nothing generated or built
    monkeypatch.setenv("OPBUILDER_HYBRID_TARGET", "python")
    k2 = kernel(traced)
    assert k2.target == "python"
    ops.Custom(k2)(Tensor(np.array([1.0], np.float32)))
    assert k2._built == {}
    with pytest.raises(ValueError, match="hybrid target 'gpu' is not one of cpu, python"):
        kernel(traced, target="gpu")


def test_the_dsl_names_are_not_written_into_the_module():
    elementwise(np.ones(2), np.ones(2))
    assert "output_tensor" not in globals() and "vectorize" not in globals() and "sqrt" not in globals()


def test_generated_source_is_inspectable_and_kept_in_the_cache(cache_dir):
    src = elementwise.source(np.ones(3, np.float32), np.ones(3, np.float32))
    assert 'extern "C" int hybrid_elementwise_' in src
    assert "const float *__restrict u_x = static_cast<const float *>(params[0]);" in src  # names.var("x")
    assert "#pragma GCC ivdep" in src  # the vectorize hint
    ops.Custom(elementwise)(Tensor(np.ones(3, np.float32)), Tensor(np.ones(3, np.float32)))
    kept = list((cache_dir / "hybrid").glob("hybrid_elementwise_*.cpp"))
    assert any(p.read_text() == src for p in kept)


def test_debug_build_fills_outputs_with_nan_and_checks_indices():
    def square(x):  # seed 001's forward: reads its output before writing it
        y = output_tensor(x.shape, x.dtype)
        for i0 in range(x.shape[0]):
            y[i0] = y[i0] * y[i0]
        return y

    x = Tensor(np.array([1.0, 4.0, 9.0], np.float32))
    assert np.isnan(ops.Custom(kernel(square, debug=True))(x).asnumpy()).all()
    assert np.isnan(kernel(square, target="python", debug=True)(x)).all()

    def shifted(x):
        y = output_tensor(x.shape, x.dtype)
        for i in range(x.shape[0]):
            y[i] = x[i + 1]
        return y

    line = shifted.__code__.co_firstlineno + 3
    with pytest.raises(RuntimeError, match=rf"test_hybrid_kernels.py:{line}: x\[i \+ 1\]: index 3 is out of range "
                                           rf"for a dimension of size 3"):
        ops.Custom(kernel(shifted, debug=True))(x)


def test_a_plain_function_with_func_type_akg_and_a_kernel_object_are_the_same():
    def double(x):
        y = output_tensor(x.shape, x.dtype)
        for i in range(x.shape[0]):
            y[i] = x[i] * 2
        return y

    a = ops.Custom(double, func_type="akg")
    b = ops.Custom(kernel(double))
    assert isinstance(a._hybrid, HybridKernel) and a.func_type == "akg" and b.func_type == "hybrid"
    x = Tensor(np.array([1.0, 2.0], np.float32))
    np.testing.assert_array_equal(a(x).asnumpy(), b(x).asnumpy())


def test_generated_cxx_has_no_warnings_under_wall_wextra(tmp_path):
    import shutil
    import subprocess
    from opbuilder import include_dir
    cxx = shutil.which("c++") or shutil.which("g++")
    cases = [(elementwise, [("float16", 1), ("int32", 1)], False), (matmul_stats, [("float32", 2)] * 2, True),
             (volume, [("int32", 3)], True)]
    for k, sig, debug in cases:
        src = kernel(k.func, debug=debug).source(*sig)
        path = tmp_path / f"{k.__name__}.cpp"
        path.write_text(src)
        res = subprocess.run([cxx, "-std=c++17", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", "-isystem",
                              str(include_dir()), str(path)], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr


@kernel
def negatives(x, idx):
    y = output_tensor((x.shape[0], 4), x.dtype)
    before = allocate((x.shape[0],), x.dtype)  # zero-filled in both targets: read before it is written
    for i in range(x.shape[0]):
        y[i, 0] = x[i - 1] + before[i]  # i = 0 reads the last element, as in Python
        y[i, 1] = x[-1] * x[idx[i]]  # idx holds negative entries
        y[-1 - i, 2] = x[i]
        before[i] = x[i]
    for i in serial(x.shape[0] - 1, -1, -1):
        y[i, 3] = x[i] + before[i - x.shape[0]]
    return y


def test_negative_indices_wrap_once_as_in_python_in_both_targets():
    x = np.array([1.5, -2.0, 4.0, 8.0, 0.25])
    idx = np.array([-1, 0, -5, 4, -3], np.int64)
    want = np.stack([np.roll(x, 1), x[-1] * x[idx], x[::-1], 2 * x], axis=1)
    np.testing.assert_array_equal(negatives(x, idx), want)  # the Python target: numpy's own indexing
    got = _compare(negatives, x, idx)[0]
    np.testing.assert_array_equal(got.asnumpy(), want)
    src = negatives.source(x, idx)
    assert "u_x[ob::wrap((u_i - INT64_C(1)), u_x_n0)]" in src and "u_x[ob::wrap(u_idx[u_i], u_x_n0)]" in src
    assert "u_before[u_i] = u_x[u_i];" in src  # an index known not to be negative is used as it is
    assert "u_y[(u_i) * u_y_n1 + INT64_C(3)] = " in src  # a loop counting down to 0 is not wrapped either


def test_debug_build_reports_a_negative_index_beyond_the_wrap():
    x = Tensor(np.array([1.0, 2.0, 3.0]))
    bad = Tensor(np.array([0, -4, 1], np.int64))
    with pytest.raises(RuntimeError, match=r"test_hybrid_kernels.py:\d+: x\[idx\[i\]\]: index -4 is out of range "
                                           r"for a dimension of size 3"):
        ops.Custom(kernel(negatives.func, debug=True))(x, bad)
    with pytest.raises(IndexError):  # the Python target: numpy refuses it too
        kernel(negatives.func, target="python", debug=True)(x, bad)


def k_floordiv(a, b):
    c = output_tensor(a.shape, a.dtype)
    for i in range(a.shape[0]):
        c[i] = a[i] // b[i]
    return c


def k_mod(a, b):
    c = output_tensor(a.shape, a.dtype)
    for i in range(a.shape[0]):
        c[i] = a[i] % b[i]
    return c


def k_pow(a, b):
    c = output_tensor(a.shape, a.dtype)
    for i in range(a.shape[0]):
        c[i] = a[i] ** b[i]
    return c


BINARY = {"//": k_floordiv, "%": k_mod, "**": k_pow}


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_the_lowest_integer_divided_by_minus_one_wraps_as_numpy(dtype):
    a = np.array([np.iinfo(dtype).min, 7, -7], dtype)
    b = np.array([-1, -1, 2], dtype)
    with np.errstate(over="ignore"):
        want_div, want_mod = a // b, a % b
    np.testing.assert_array_equal(ops.Custom(kernel(k_floordiv))(Tensor(a), Tensor(b)).asnumpy(), want_div)
    np.testing.assert_array_equal(ops.Custom(kernel(k_mod))(Tensor(a), Tensor(b)).asnumpy(), want_mod)


@pytest.mark.parametrize("op", ["//", "%", "**"])
def test_float16_floor_division_modulo_and_power_compile_and_match(op):
    a = np.array([1.5, -2.25, 3.0], np.float16)
    b = np.array([0.5, 2.0, 2.0], np.float16)
    want = {"//": a // b, "%": a % b, "**": a ** b}[op]
    got = ops.Custom(kernel(BINARY[op]))(Tensor(a), Tensor(b)).asnumpy()
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-3)


def test_an_input_of_a_dtype_the_dsl_lacks_is_a_type_error_naming_it():
    """bfloat16 is a runtime dtype but not a DSL one: the compiled target raised a bare KeyError('bfloat16')
    while generating C++, where the Python target says what is wrong."""
    def square(x):
        y = output_tensor(x.shape, x.dtype)  # noqa: F821 (a DSL intrinsic)
        for i0 in range(x.shape[0]):
            y[i0] = x[i0] * x[i0]
        return y

    op = ops.Custom(square, lambda x: x, lambda x: x, func_type="akg")
    with pytest.raises(TypeError, match=r"^hybrid kernel 'square': input 0 is bfloat16, which is not a dtype of the "
                                        r"hybrid DSL \(it takes float16, float32, float64, int8, int16, int32, int64, "
                                        r"uint8, bool\); cast it first$"):
        op(Tensor([1.0, 4.0], rt.bfloat16))
