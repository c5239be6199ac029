"""The extended dtypes on the C++ side (issue 23): DataType and the bridge for bfloat16, complex64/128 and
uint16/32/64 (tensors in and out without copies), the OB_DISPATCH_* macros (a Function on bf16 and complex,
its gradients, the error naming the supported dtypes), opbuilder::bfloat16's rounding, and the aot ABI's
dtype names. Both operators are built once per session (tests/cpp/dtype_ops.cpp: the `dtype_ops` fixture in
conftest.py, shared with test_interop_dtypes.py; aot_dtype_ops.cpp)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import runtime as rt
from runtime import Tensor, ops
from runtime.ops import math as m
from op_util import CPP
from numeric_util import central

BF16 = np.dtype(ml_dtypes.bfloat16)
ALL = ["float16", "bfloat16", "float32", "float64", "complex64", "complex128", "int8", "int16", "int32", "int64",
       "uint8", "uint16", "uint32", "uint64", "bool"]


@pytest.fixture(scope="session")
def aot_dtype_lib(cache_dir):
    from opbuilder import build_library
    return build_library("aot_dtype_ops", [str(CPP / "aot_dtype_ops.cpp")], cflags=["-Wall", "-Wextra", "-Werror"])


@pytest.mark.parametrize("name", ALL)
def test_every_dtype_crosses_into_cpp_and_back(dtype_ops, name):
    arr = np.zeros(3, BF16 if name == "bfloat16" else name)
    assert dtype_ops.dtype_name(Tensor(arr)) == name
    assert dtype_ops.dtype_name(arr) == name  # a plain numpy array too


@pytest.mark.parametrize("name", ["bfloat16", "complex64", "complex128", "uint16", "uint32", "uint64", "int8"])
def test_tensors_made_in_cpp_reach_python_in_their_dtype(dtype_ops, name):
    t = dtype_ops.iota(name, 5)
    assert t.dtype is getattr(rt, name)
    assert np.real(t.asnumpy()).astype(np.float64).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.uint64])
def test_unsigned_tensors_in_and_out(dtype_ops, dtype):
    top = np.iinfo(dtype).max
    x = Tensor(np.array([0, 7, top - 1, top], dtype))
    out = dtype_ops.add_one(x)
    assert out.dtype is rt.dtypes.to_dtype(dtype)
    assert [int(v) for v in out.asnumpy()] == [1, 8, int(top), 0]  # wraps as unsigned C++ arithmetic does


def test_bfloat16_rounds_to_nearest_even_as_ml_dtypes_does(dtype_ops):
    bits = np.array([0x3F808000, 0x3F818000, 0x3F80FFFF, 0x3F808001, 0x7F7FFFFF, 0x7F800000, 0xFF800000,
                     0x7FC00001, 0x00000001, 0x80000000, 0x477FE000], np.uint32)
    r = np.random.default_rng(0)
    f = np.concatenate([bits.view(np.float32), r.standard_normal(200).astype(np.float32) * 1e3,
                        r.integers(0, 2 ** 32, 300, dtype=np.uint64).astype(np.uint32).view(np.float32)])
    got = dtype_ops.to_bfloat16(Tensor(f))
    assert got.dtype is rt.bfloat16
    with np.errstate(invalid="ignore"):  # NaN payloads
        want = f.astype(BF16)
    finite = ~np.isnan(f)
    np.testing.assert_array_equal(got.asnumpy().view(np.uint16)[finite], want.view(np.uint16)[finite])
    assert np.isnan(got.asnumpy().astype(np.float32)[~finite]).all()
    back = dtype_ops.from_bfloat16(got)
    np.testing.assert_array_equal(back.asnumpy()[finite], want.astype(np.float32)[finite])


def _z(n, seed):
    r = np.random.default_rng(seed)
    return r.standard_normal(n) + 1j * r.standard_normal(n)


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_a_cpp_function_on_complex_forward_and_gradients(dtype_ops, dtype):
    a, b = _z(4, 1), _z(4, 2)
    x, y = Tensor(a.astype(dtype)), Tensor(b.astype(dtype))
    np.testing.assert_allclose(dtype_ops.mul(x, y).asnumpy(), (a.astype(dtype) * b.astype(dtype)),
                               rtol=1e-6)

    def loss(x, y):
        return m.sum(m.abs(m.sub(dtype_ops.mul(x, y), 1.0)) ** 2)

    gx, gy = rt.grad(loss, grad_position=(0, 1))(Tensor(a), Tensor(b))
    assert gx.dtype is rt.complex128

    def f(re, im, other, first):
        z = re + 1j * im
        args = (Tensor(z), Tensor(other)) if first else (Tensor(other), Tensor(z))
        return loss(*args).item()

    for g, z0, other, first in [(gx, a, b, True), (gy, b, a, False)]:
        want = central(lambda re: f(re, z0.imag, other, first), z0.real) \
            + 1j * central(lambda im: f(z0.real, im, other, first), z0.imag)
        np.testing.assert_allclose(g.asnumpy(), want, rtol=1e-6, atol=1e-7)


def test_a_cpp_function_on_bfloat16_against_float32(dtype_ops):
    a = np.random.default_rng(3).standard_normal(6).astype(np.float32).astype(BF16)
    b = np.random.default_rng(4).standard_normal(6).astype(np.float32).astype(BF16)
    out = dtype_ops.mul(Tensor(a), Tensor(b))
    assert out.dtype is rt.bfloat16
    # one product of two bf16 values, computed in float and rounded once: exactly ml_dtypes' rounding
    np.testing.assert_array_equal(out.asnumpy(), (a.astype(np.float32) * b.astype(np.float32)).astype(BF16))

    def loss(x, y):
        return m.sum(m.mul(dtype_ops.mul(x, y), dtype_ops.mul(x, x)))

    g16 = rt.grad(loss, grad_position=(0, 1))(Tensor(a), Tensor(b))
    g32 = rt.grad(loss, grad_position=(0, 1))(Tensor(a.astype(np.float32)), Tensor(b.astype(np.float32)))
    for lo, ref in zip(g16, g32):
        assert lo.dtype is rt.bfloat16
        np.testing.assert_allclose(lo.asnumpy().astype(np.float32), ref.asnumpy(), rtol=2 ** -6,
                                   atol=2 ** -6 * np.abs(ref.asnumpy()).max())


def test_dispatch_on_an_unsupported_dtype_names_the_supported_ones(dtype_ops):
    with pytest.raises(TypeError, match=r"^dtype_ops\.mul: unsupported dtype int32; supported: float32, float64, "
                                        r"complex64, complex128, bfloat16$"):
        dtype_ops.mul(Tensor(np.ones(2, np.int32)), Tensor(np.ones(2, np.int32)))
    with pytest.raises(TypeError, match=r"^dtype_ops\.add_one: unsupported dtype complex64; supported: int8, int16, "
                                        r"int32, int64, uint8, uint16, uint32, uint64, float32, float64$"):
        dtype_ops.add_one(Tensor(np.ones(2, np.complex64)))
    with pytest.raises(TypeError, match=r"^dtype_ops\.sum_floating: unsupported dtype bfloat16; supported: "
                                        r"float32, float64$"):
        dtype_ops.sum_floating(Tensor(np.ones(2, BF16)))
    assert dtype_ops.sum_floating(Tensor(np.arange(4, dtype=np.float64))) == 6.0


def test_a_dtype_the_bridge_cannot_take_lists_all_it_can(dtype_ops):
    with pytest.raises(TypeError, match=r"^opbuilder: unsupported tensor dtype float128; supported: "
                                        + ", ".join(ALL[i] for i in [14, 6, 7, 8, 9, 10, 0, 2, 3, 1, 4, 5, 11, 12, 13])
                                        + "$"):
        dtype_ops.dtype_name(np.ones(2, np.longdouble))


@pytest.mark.parametrize("dtype", [BF16, np.complex64, np.complex128, np.uint16, np.uint32, np.uint64, np.float32])
def test_an_aot_op_on_the_new_dtypes(aot_dtype_lib, dtype):
    op = ops.Custom(f"{aot_dtype_lib}:MulAny", out_shape=lambda x, _: x, out_dtype=lambda x, _: x, func_type="aot")
    a = (np.arange(1, 5) * (1 + 1j if np.dtype(dtype).kind == "c" else 1)).astype(dtype)
    b = (np.arange(4, 0, -1) * (1 - 2j if np.dtype(dtype).kind == "c" else 1)).astype(dtype)
    out = op(Tensor(a), Tensor(b))
    assert out.asnumpy().dtype == np.dtype(dtype)
    want = (a.astype(np.float32) * b.astype(np.float32)).astype(BF16) if dtype is BF16 else a * b
    np.testing.assert_array_equal(out.asnumpy(), want)


def test_an_aot_op_on_a_dtype_it_does_not_dispatch_reports_why(aot_dtype_lib):
    op = ops.Custom(f"{aot_dtype_lib}:MulAny", out_shape=lambda x, _: x, out_dtype=lambda x, _: x, func_type="aot")
    with pytest.raises(RuntimeError, match=r"aot operator 'MulAny' in .*: threw a C\+\+ exception: MulAny: "
                                           r"unsupported dtype int16; supported: float32, float64, complex64, "
                                           r"complex128, bfloat16, uint16, uint32, uint64$"):
        op(Tensor(np.ones(2, np.int16)), Tensor(np.ones(2, np.int16)))
