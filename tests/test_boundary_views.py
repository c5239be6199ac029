"""The C++ boundary with views: kernels written as the seeds write them (flat
loops over data<T>() / data_c()) are right for every view a user passes in and
every gradient the engine hands to Backward; kAcceptsViews passes views as
they are; data<T>() refuses a strided view; read-only memory is never written."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import runtime as rt
from runtime import Tensor, ops
from runtime.autograd.gradcheck import gradcheck

from op_util import BINDINGS, CPP, load_op
from builder_util import child_env


@pytest.fixture(scope="session", params=BINDINGS)
def seed_ops(cache_dir, request):
    """tests/cpp/seed_style_ops.cpp bound with each layer (views are the core's, not the binding's)."""
    return load_op("seed_style_ops", [CPP / "seed_style_ops.cpp"], cflags=["-Wall", "-Wextra", "-Werror"],
                 binding=request.param)


def _binding_of(module) -> str:
    return "nanobind" if type(module.mul).__name__ == "nb_func" else "pybind11"


@pytest.fixture(scope="session")
def seed_ms_ops(cache_dir):
    return load_op("seed_ms_ops", [CPP / "seed_ms_ops.cpp"], cflags=["-Wall", "-Wextra", "-Werror"])


def _base(shape=(6, 8), dtype=np.float64, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# Each view kind: (name, make(base Tensor) -> view Tensor or ndarray)
VIEWS = [
    ("transpose", lambda t: ops.transpose(t)),
    ("T", lambda t: t.T),
    ("every_other_column", lambda t: t[:, ::2]),
    ("reversed_rows", lambda t: t[::-1]),
    ("column", lambda t: t[:, 1]),
    ("broadcast_to", lambda t: ops.broadcast_to(t[0:1], (5, 6, 8))),
    ("numpy_transpose", lambda t: t.asnumpy().T),
    ("numpy_fortran", lambda t: np.asfortranarray(t.asnumpy())),
    ("numpy_strided", lambda t: t.asnumpy()[::2, 1::3]),
]


def _np(v):
    return np.asarray(v.asnumpy() if isinstance(v, Tensor) else v)


def test_views_are_not_contiguous_to_begin_with():
    # the cases below would pass vacuously if the runtime handed out copies
    t = Tensor(_base())
    for name, make in VIEWS:
        if name == "numpy_fortran":
            continue
        arr = _np(make(t))
        assert not arr.flags.c_contiguous, name


@pytest.mark.parametrize("name,make", VIEWS, ids=[v[0] for v in VIEWS])
def test_forward_gets_views_right_native_api(seed_ops, name, make):
    t = Tensor(_base())
    v = make(t)
    expected = _np(v) * _np(v)
    np.testing.assert_array_equal(seed_ops.square(v).asnumpy(), expected)
    assert seed_ops.seen()["forward_contiguous"] is True
    other = np.arange(expected.size, dtype=np.float64).reshape(expected.shape)
    np.testing.assert_array_equal(seed_ops.mul(v, Tensor(other)).asnumpy(), _np(v) * other)
    np.testing.assert_array_equal(seed_ops.mul(v, v).asnumpy(), expected)


@pytest.mark.parametrize("name,make", VIEWS, ids=[v[0] for v in VIEWS])
def test_forward_gets_views_right_ms_extension(seed_ms_ops, name, make):
    t = Tensor(_base(dtype=np.float32))
    v = make(t)
    other = np.linspace(-1, 1, _np(v).size, dtype=np.float32).reshape(_np(v).shape)
    np.testing.assert_array_equal(seed_ms_ops.mul(v, Tensor(other)).asnumpy(), _np(v) * other)


def test_tensor_list_arguments_are_made_contiguous(seed_ops):
    a = _base((4, 5))
    out = seed_ops.sum_list([Tensor(a).T, Tensor(a.T.copy()), a.T])
    np.testing.assert_array_equal(out.asnumpy(), 3 * a.T)


# ---- gradients that reach Backward as views --------------------------------------------
REDUCTIONS = [
    ("sum", lambda y: ops.sum(y)),
    ("sum_axis0", lambda y: ops.sum(y, 0)),
    ("sum_axis_last", lambda y: ops.sum(y, -1)),
    ("mean", lambda y: ops.mean(y)),
    ("mean_axis", lambda y: ops.mean(y, 1, True)),
]


@pytest.mark.parametrize("rname,reduce", REDUCTIONS, ids=[r[0] for r in REDUCTIONS])
def test_backward_gets_broadcast_gradients_right(seed_ops, rname, reduce):
    x = Tensor(_base((4, 3)))
    assert gradcheck(lambda t: reduce(seed_ops.square(t)), [x])
    assert seed_ops.seen()["grad_contiguous"] is True
    assert gradcheck(lambda a, b: reduce(seed_ops.mul(a, b)), [x, Tensor(_base((4, 3), seed=1))])
    assert gradcheck(lambda t: reduce(seed_ops.square(t.T)), [x])


def test_backward_gets_broadcast_to_gradient_right(seed_ops):
    x = Tensor(_base((4, 3)))
    assert gradcheck(lambda t: ops.broadcast_to(ops.sum(seed_ops.square(t)), (2, 3)), [x])
    assert gradcheck(lambda t: seed_ops.square(ops.broadcast_to(t, (5, 4, 3))), [x])
    assert gradcheck(lambda t: ops.sum(seed_ops.square(ops.broadcast_to(t[0:1], (5, 3)))), [x])


def test_every_entry_point_gives_the_same_gradient(seed_ops, seed_ms_ops):
    xa = _base((5, 4))
    want = 2 * xa
    g = rt.grad(lambda t: ops.sum(seed_ops.square(t)))(Tensor(xa))
    np.testing.assert_allclose(g.asnumpy(), want)
    out, g = rt.value_and_grad(lambda t: ops.sum(seed_ops.square(t.T), 0))(Tensor(xa))
    np.testing.assert_allclose(out.asnumpy(), (xa * xa).sum(1))
    np.testing.assert_allclose(g.asnumpy(), want)
    leaf = Tensor(xa, requires_grad=True)
    ops.mean(seed_ops.square(leaf[:, ::2])).backward()
    expected = np.zeros_like(xa)
    expected[:, ::2] = 2 * xa[:, ::2] / xa[:, ::2].size
    np.testing.assert_allclose(leaf.grad.asnumpy(), expected)
    # the seed's own ms_extension.h operator on arrays (float32: compare in float32)
    x32, y32 = Tensor(xa.astype(np.float32)), Tensor((xa + 1).astype(np.float32))
    gx, gy = rt.grad(lambda a, b: ops.sum(seed_ms_ops.mul(a, b)), grad_position=(0, 1))(x32, y32)
    np.testing.assert_allclose(gx.asnumpy(), y32.asnumpy())
    np.testing.assert_allclose(gy.asnumpy(), x32.asnumpy())


def test_saved_tensors_are_what_forward_saw(seed_ops):
    x = Tensor(_base((3, 4)), requires_grad=True)
    ops.sum(seed_ops.square(x.T)).backward()
    seen = seed_ops.seen()
    assert seen["saved_contiguous"] is True
    assert seen["saved_same_as_forward"] is True
    np.testing.assert_allclose(x.grad.asnumpy(), 2 * x.asnumpy())


def test_two_million_elements_in_a_child_process(seed_ops, cache_dir):
    # a flat loop over a 0-stride gradient read far past its buffer: at this size, a segfault
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(CPP.parent)!r})
        import numpy as np
        import runtime as rt
        from runtime import Tensor, ops
        from op_util import load_op, CPP
        m = load_op("seed_style_ops", [CPP / "seed_style_ops.cpp"], cflags=["-Wall", "-Wextra", "-Werror"],
                  binding={_binding_of(seed_ops)!r})
        n = 2_000_000
        xa = np.random.default_rng(0).standard_normal((2, n // 2)).astype(np.float32)
        g = rt.grad(lambda t: ops.sum(m.square(t)))(Tensor(xa))
        np.testing.assert_allclose(g.asnumpy(), 2 * xa, rtol=1e-6)
        g = rt.grad(lambda t: ops.sum(m.square(t.T), 1))(Tensor(xa))
        np.testing.assert_allclose(g.asnumpy(), 2 * xa, rtol=1e-6)
        g = rt.grad(lambda t: ops.mean(m.mul(t, t)))(Tensor(xa))
        np.testing.assert_allclose(g.asnumpy(), 2 * xa / xa.size, rtol=1e-5)
        b = ops.broadcast_to(Tensor(xa[0]), (2, n // 2))
        np.testing.assert_array_equal(m.square(b).asnumpy(), np.broadcast_to(xa[0] * xa[0], (2, n // 2)))
        g = rt.grad(lambda t: ops.sum(m.square(ops.broadcast_to(t, (2, n // 2)))))(Tensor(xa[0]))
        np.testing.assert_allclose(g.asnumpy(), 4 * xa[0], rtol=1e-6)
        g = rt.grad(lambda t: ops.sum(ops.broadcast_to(ops.sum(m.square(t)), (n,))))(Tensor(xa))
        np.testing.assert_allclose(g.asnumpy(), 2 * n * xa, rtol=1e-5)
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       env=child_env(OPBUILDER_CACHE_DIR=str(cache_dir)), timeout=300)
    assert r.returncode == 0, f"child exited {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.strip().endswith("ok")


# ---- the opt-in -----------------------------------------------------------------------
def test_accepts_views_gets_the_view_as_it_is(seed_ops):
    xa = _base((3, 4))
    out = seed_ops.view_square(Tensor(xa).T)
    np.testing.assert_array_equal(out.asnumpy(), xa.T * xa.T)
    assert seed_ops.seen()["view_forward_strides"] == [1, 4]  # no copy: the transpose's strides
    g = rt.grad(lambda t: ops.sum(seed_ops.view_square(t)))(Tensor(xa))
    np.testing.assert_allclose(g.asnumpy(), 2 * xa)
    assert seed_ops.seen()["view_grad_strides"] == [0, 0]  # sum's broadcast gradient, uncopied
    assert gradcheck(lambda t: ops.sum(seed_ops.view_square(t[::-1, ::2]), 1), [Tensor(xa)])


def test_demo_mul_takes_views_without_copying(my_ops):
    xa = _base((3, 4))
    np.testing.assert_array_equal(my_ops.mul(Tensor(xa).T, Tensor(xa).T).asnumpy(), xa.T * xa.T)
    assert gradcheck(lambda a, b: ops.sum(my_ops.mul(a.T, b), 0), [Tensor(xa), Tensor(_base((4, 1), seed=2))])


# ---- data<T>() and data_c() on a strided view --------------------------------------------
def test_data_on_a_strided_view_is_an_error(seed_ops):
    t = Tensor(_base((3, 4)))
    with pytest.raises(ValueError, match=r"data<T>\(\): the tensor is not contiguous \(shape \[4, 3\], "
                                         r"strides \[1, 4\]\); call contiguous\(\) first"):
        seed_ops.raw_first(t.T)
    with pytest.raises(ValueError, match=r"data_c\(\): the tensor is not contiguous.*call contiguous\(\)"):
        seed_ops.raw_first_c(t[:, 1])
    assert seed_ops.raw_first(t) == t.asnumpy()[0, 0]
    assert seed_ops.raw_ptr_offset(t, t[:, 1]) == 8  # data_ptr() stays the raw address


# ---- read-only memory ----------------------------------------------------------------------
def _readonly(a):
    a = a.copy()
    a.flags.writeable = False
    return a


def test_marking_read_only_memory_dirty_is_an_error(seed_ops):
    a = _readonly(_base((2, 3)))
    before = a.copy()
    with pytest.raises(ValueError, match=r"AddInPlace: argument 0 is read-only memory .* marked it dirty .* "
                                         r"pass a writable copy"):
        seed_ops.add_(rt.from_numpy(a), Tensor(np.ones((2, 3))))
    np.testing.assert_array_equal(a, before)
    buf = bytes(np.arange(6, dtype=np.float64).tobytes())
    view = np.frombuffer(buf, dtype=np.float64).reshape(2, 3)
    with pytest.raises(ValueError, match="read-only memory"):
        seed_ops.add_(rt.from_numpy(view), Tensor(np.ones((2, 3))))
    assert buf == np.arange(6, dtype=np.float64).tobytes()


def test_an_undeclared_write_to_a_read_only_input_lands_in_a_private_copy(seed_ops):
    a = _readonly(_base((2, 3)))
    before = a.copy()
    seed_ops.sneaky_write(rt.from_numpy(a))  # no grad: not detected, but harmless
    np.testing.assert_array_equal(a, before)
    with pytest.raises(RuntimeError, match=r"SneakyWrite::Forward modified argument 0 in place without MarkDirty"):
        seed_ops.sneaky_write(rt.from_numpy(a).requires_grad_())
    np.testing.assert_array_equal(a, before)


def test_read_only_memory_map_in_a_child_process(seed_ops, cache_dir, tmp_path):
    path = tmp_path / "ro.bin"
    np.arange(12, dtype=np.float64).tofile(path)
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(CPP.parent)!r})
        import numpy as np
        from runtime import Tensor, from_numpy
        from op_util import load_op, CPP
        m = load_op("seed_style_ops", [CPP / "seed_style_ops.cpp"], cflags=["-Wall", "-Wextra", "-Werror"],
                  binding={_binding_of(seed_ops)!r})
        mm = np.memmap({str(path)!r}, dtype=np.float64, mode="r", shape=(3, 4))
        m.sneaky_write(from_numpy(mm))
        assert (np.asarray(mm) == np.arange(12).reshape(3, 4)).all()
        try:
            m.add_(from_numpy(mm), Tensor(np.ones((3, 4))))
        except ValueError as e:
            print("refused:", e)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       env=child_env(OPBUILDER_CACHE_DIR=str(cache_dir)), timeout=300)
    assert r.returncode == 0, f"child exited {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "refused: AddInPlace: argument 0 is read-only memory" in r.stdout
    assert np.array_equal(np.fromfile(path, dtype=np.float64), np.arange(12))


def test_in_place_op_on_a_strided_view_writes_back(seed_ops):
    base = np.zeros((4, 6))
    view = base[:, ::2]
    out = seed_ops.add_(rt.from_numpy(view), Tensor(np.ones((4, 3))))
    np.testing.assert_array_equal(base[:, ::2], np.ones((4, 3)))
    np.testing.assert_array_equal(base[:, 1::2], np.zeros((4, 3)))
    np.testing.assert_array_equal(out.asnumpy(), np.ones((4, 3)))


def test_in_place_op_on_a_view_with_grad_writes_back_and_differentiates(seed_ops):
    x = Tensor(_base((4, 3)), requires_grad=True)
    y = Tensor(_base((3, 4), seed=3), requires_grad=True)
    z = x * 1
    w = seed_ops.add_(z.T, y)
    np.testing.assert_allclose(w.asnumpy(), x.asnumpy().T + y.asnumpy())
    ops.sum(w).backward()
    np.testing.assert_allclose(x.grad.asnumpy(), np.ones((4, 3)))
    np.testing.assert_allclose(y.grad.asnumpy(), np.ones((3, 4)))


# ---- integers are not differentiable -----------------------------------------------------
def test_integer_outputs_take_no_gradient(seed_ops):
    x = Tensor(_base((2, 3)) * 4, requires_grad=True)
    k = seed_ops.floor_int(x)
    assert k.dtype == rt.int64 and k.requires_grad is False
    np.testing.assert_array_equal(k.asnumpy(), np.trunc(x.asnumpy()).astype(np.int64))
    c = ops.cast(x, rt.int32)
    assert c.requires_grad is False


def test_grad_with_respect_to_an_integer_input_is_zeros():
    # as MindSpore: an integer input gets a zero gradient of its shape, never integer "gradients"
    i = Tensor(np.array([1, 2, 3], dtype=np.int32))
    f = Tensor(np.array([0.5, 1.5, 2.5], dtype=np.float32))
    gi, gf = rt.grad(lambda a, b: ops.sum(ops.mul(ops.cast(a, rt.float32), b)), grad_position=(0, 1))(i, f)
    assert gi.dtype == rt.int32
    np.testing.assert_array_equal(gi.asnumpy(), [0, 0, 0])
    np.testing.assert_array_equal(gf.asnumpy(), [1, 2, 3])


# ---- sizes ---------------------------------------------------------------------------------
def test_overflowing_shape_is_a_memory_error(seed_ops, my_ops):
    with pytest.raises(MemoryError, match=r"shape \[1152921504606846976, 4\] and dtype float32: its size in bytes "
                                          r"overflows"):
        seed_ops.empty([1 << 60, 4])
    with pytest.raises(ValueError, match=r"shape \[4611686018427387904, 4\] has too many elements"):
        seed_ops.empty([1 << 62, 4])
    with pytest.raises(MemoryError, match=r"out of memory allocating 4503599627370496 bytes for a tensor of shape "
                                          r"\[1125899906842624\] and dtype float32"):
        seed_ops.empty([1 << 50])
    big = 1 << 31
    x = ops.broadcast_to(Tensor(np.ones(1, np.float32)), (big,))
    y = ops.broadcast_to(Tensor(np.ones((1, 1), np.float32)), (big, 1))
    with pytest.raises(MemoryError, match=r"shape \[2147483648, 2147483648\] and dtype float32"):
        my_ops.mul(x, y)


@pytest.mark.parametrize("side", [2 ** 31, 2 ** 33])
def test_a_result_too_big_for_numpy_is_a_memory_error_naming_the_op(side):
    """At 2^33 a side numpy says "iterator is too large" (its element count), not "array is too big": that
    ValueError came out bare, without the op's name the docs promise."""
    x = ops.broadcast_to(Tensor(np.ones(1, np.float32)), (side, 1))
    y = ops.broadcast_to(Tensor(np.ones(1, np.float32)), (1, side))
    with pytest.raises(MemoryError, match=rf"^op 'mul': cannot allocate its result for inputs of shapes "
                                          rf"\[\[{side}, 1\], \[1, {side}\]\] and dtypes Float32, Float32"):
        x * y


def test_a_huge_broadcast_argument_costs_its_memory_not_its_size(my_ops, cache_dir):
    """The first call of an op keeps what a refused write would put back: the memory an argument spans, one
    element for a [2^31] broadcast, not a copy of its 2^31 elements (8 GB each, minutes, or out of memory).
    In a child process limited to 3 GB of address space, the op's own error is the one raised."""
    script = textwrap.dedent(f"""
        import resource, sys
        sys.path.insert(0, {str(CPP.parent)!r})
        import numpy as np
        from runtime import Tensor, ops
        from op_util import load_op, CUSTOM_SRC
        m = load_op("my_ops", [CUSTOM_SRC / "function_ops.cpp"])
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, resource.RLIM_INFINITY))
        big = 1 << 31
        x = ops.broadcast_to(Tensor(np.ones(1, np.float32)), (big,))
        y = ops.broadcast_to(Tensor(np.ones((1, 1), np.float32)), (big, 1))
        try:
            m.mul(x, y)
        except MemoryError as e:
            print(e)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       env=child_env(OPBUILDER_CACHE_DIR=str(cache_dir), OPENBLAS_NUM_THREADS="1"), timeout=300)
    assert r.returncode == 0, f"child exited {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "shape [2147483648, 2147483648] and dtype float32" in r.stdout, r.stdout + r.stderr


def test_empty_and_zero_size_views(seed_ops):
    e = Tensor(np.zeros((0, 3)))
    assert seed_ops.square(e).shape == (0, 3)
    assert seed_ops.square(Tensor(np.zeros((3, 4)))[:, 4:]).shape == (3, 0)
    g = rt.grad(lambda t: ops.sum(seed_ops.square(t)))(Tensor(np.zeros((0, 2))))
    assert g.shape == (0, 2)


@pytest.mark.build  # the AOT op compiles custom_src/aot_add.cpp (tests/build_guard.py)
def test_overflowing_results_of_built_in_and_aot_ops_are_memory_errors():
    big = 1 << 31
    x = ops.broadcast_to(Tensor(np.ones(1, np.float32)), (big,))
    y = ops.broadcast_to(Tensor(np.ones((1, 1), np.float32)), (big, 1))
    with pytest.raises(MemoryError, match=r"op 'mul': cannot allocate its result for inputs of shapes "
                                          r"\[\[2147483648\], \[2147483648, 1\]\] and dtypes Float32, Float32: its size"):
        x * y
    from op_util import CUSTOM_SRC
    msg = r"Custom 'CustomAdd': cannot allocate output 0 of shape \[4611686018427387904, 4\] and dtype Float32: its size"
    with pytest.raises(MemoryError, match=msg):  # a fixed out_shape: when the op is made
        ops.Custom(f"{CUSTOM_SRC / 'aot_add.cpp'}:CustomAdd", out_shape=[1 << 62, 4], out_dtype=rt.float32,
                   func_type="aot")
    add = ops.Custom(f"{CUSTOM_SRC / 'aot_add.cpp'}:CustomAdd", out_shape=lambda a, b: [1 << 62, 4],
                     out_dtype=rt.float32, func_type="aot")
    with pytest.raises(MemoryError, match=msg):  # computed from the inputs: at the call
        add(Tensor([1.0, 2.0]), Tensor([3.0, 4.0]))
