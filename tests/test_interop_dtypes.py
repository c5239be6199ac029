"""bfloat16, complex and uint16/32/64 between the runtime and PyTorch / JAX (issue 23 follow-up).

numpy cannot read DLPack's bfloat16, so torch and JAX bf16 tensors cross through their own numpy
views (no copy: the data pointers are compared); any other producer's bf16 capsule is refused by
name. to_torch and to_jax run a bf16 or complex C++ Function end to end, gradients included: bf16
against a float32 reference within bf16 tolerance, complex against central differences.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
jax = pytest.importorskip("jax", reason="jax is not installed")
jnp = pytest.importorskip("jax.numpy")

import opbuilder  # noqa: E402
import runtime as rt  # noqa: E402
from opbuilder.bridges import torch_call  # noqa: E402
from runtime import Tensor  # noqa: E402
from runtime.interop import dlpack_input  # noqa: E402

from numeric_util import central  # noqa: E402
from jax_util import x64  # noqa: E402,F401  (module-wide 64-bit arrays)

BF16 = np.dtype(ml_dtypes.bfloat16)


class OnlyDlpack:
    """Nothing but the DLPack protocol, over another object (a producer the runtime does not know)."""

    def __init__(self, inner) -> None:
        self._inner = inner

    def __dlpack__(self, **kw):
        return self._inner.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._inner.__dlpack_device__()


def _bf16(seed, n=6):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32).astype(BF16)


def _z(seed, n=4):
    r = np.random.default_rng(seed)
    return r.standard_normal(n) + 1j * r.standard_normal(n)


# ---- into the runtime, without copies ----

def test_a_torch_bfloat16_tensor_becomes_a_runtime_tensor_over_its_memory():
    t = torch.tensor([1.5, -2.0, 3.25], dtype=torch.bfloat16)
    for r in (rt.from_dlpack(t), dlpack_input(t)):
        assert r.dtype is rt.bfloat16
        assert r._data.ctypes.data == t.data_ptr()
        assert r.asnumpy().astype(np.float32).tolist() == [1.5, -2.0, 3.25]
    r = rt.from_dlpack(t)
    r._data[0] = 7  # one memory
    assert t[0].item() == 7.0


def test_a_jax_bfloat16_array_becomes_a_read_only_runtime_tensor_over_its_buffer():
    a = jnp.asarray([1.5, -2.0, 3.25], jnp.bfloat16)
    r = rt.from_dlpack(a)
    assert r.dtype is rt.bfloat16
    assert r._data.ctypes.data == a.unsafe_buffer_pointer()
    assert not r._data.flags.writeable  # JAX arrays are immutable
    assert r.asnumpy().astype(np.float32).tolist() == [1.5, -2.0, 3.25]


@pytest.mark.parametrize("name", ["uint16", "uint32", "uint64", "complex64", "complex128"])
def test_torch_unsigned_and_complex_tensors_cross_without_copies(name):
    t = torch.arange(1, 4).to(getattr(torch, name))
    for r in (rt.from_dlpack(t), dlpack_input(t)):
        assert r.dtype is getattr(rt, name)
        assert r._data.ctypes.data == t.data_ptr()
        assert np.real(r.asnumpy()).tolist() == [1, 2, 3]


def test_a_bfloat16_capsule_from_an_unknown_producer_is_refused_by_name():
    for inner in (torch.ones(2, dtype=torch.bfloat16), jnp.ones(2, jnp.bfloat16)):
        with pytest.raises(TypeError, match=r"^from_dlpack: OnlyDlpack has DLPack dtype bfloat16, which numpy "
                                            r"cannot read \(bfloat16 is taken from torch and JAX tensors\)$"):
            rt.from_dlpack(OnlyDlpack(inner))


def test_a_float8_torch_tensor_is_refused_by_name():
    with pytest.raises(TypeError, match=r"^from_dlpack: Tensor has DLPack dtype float8_e4m3fn, which numpy "
                                        r"cannot read \(bfloat16 is taken from torch and JAX tensors\)$"):
        rt.from_dlpack(torch.ones(2, dtype=torch.float8_e4m3fn))


# ---- C++ ops called directly ----

@pytest.mark.build
def test_a_cpp_op_takes_torch_and_jax_bfloat16_directly(dtype_ops):
    assert dtype_ops.dtype_name(torch.ones(2, dtype=torch.bfloat16)) == "bfloat16"
    assert dtype_ops.dtype_name(jnp.ones(2, jnp.bfloat16)) == "bfloat16"
    for name in ("uint16", "uint32", "uint64", "complex128"):
        assert dtype_ops.dtype_name(torch.ones(2, dtype=getattr(torch, name))) == name


@pytest.mark.build
def test_a_cpp_op_refuses_an_unknown_producers_bfloat16_by_name(dtype_ops):
    with pytest.raises(TypeError, match=r"from_dlpack: OnlyDlpack has DLPack dtype bfloat16, which numpy cannot "
                                        r"read \(bfloat16 is taken from torch and JAX tensors\)$"):
        dtype_ops.dtype_name(OnlyDlpack(torch.ones(2, dtype=torch.bfloat16)))


# ---- to_torch ----

def test_a_torch_bfloat16_argument_reaches_the_runtime_over_its_memory():
    t = torch.tensor([1.5, -2.0], dtype=torch.bfloat16, requires_grad=True)
    r = torch_call._to_runtime("f", 0, t, ("cpu",))
    assert r.dtype is rt.bfloat16 and r._data.ctypes.data == t.data_ptr()


def test_runtime_bfloat16_reaches_torch_over_the_same_memory():
    r = Tensor(np.array([1.0, 2.5], BF16))
    for call in (None, torch_call._Call([], [], [])):  # plain, and kept with a recorded call
        t = torch_call._to_torch(r, call)
        assert t.dtype == torch.bfloat16
        assert t.data_ptr() == r._data.ctypes.data
        assert t.tolist() == [1.0, 2.5]


@pytest.mark.build
def test_to_torch_bfloat16_forward_and_gradients(dtype_ops):
    tt = opbuilder.to_torch(dtype_ops)
    a, b = _bf16(3), _bf16(4)
    want = (a.astype(np.float32) * b.astype(np.float32)).astype(BF16)
    for _ in range(3):  # the general path, the eager one, the direct one
        out = tt.mul(torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16),
                     torch.from_numpy(b.view(np.uint16)).view(torch.bfloat16))
        assert out.dtype == torch.bfloat16
        np.testing.assert_array_equal(out.view(torch.uint16).numpy(), want.view(np.uint16))

    def grads(dtype):
        x = torch.tensor(a.astype(np.float32), dtype=dtype, requires_grad=True)
        y = torch.tensor(b.astype(np.float32), dtype=dtype, requires_grad=True)
        (tt.mul(tt.mul(x, y), tt.mul(x, x))).sum().backward()
        return x.grad, y.grad

    for lo, ref in zip(grads(torch.bfloat16), grads(torch.float32)):
        assert lo.dtype == torch.bfloat16
        np.testing.assert_allclose(lo.float().numpy(), ref.numpy(), rtol=2 ** -6,
                                   atol=2 ** -6 * ref.abs().max().item())


@pytest.mark.build
def test_to_torch_bfloat16_out_of_float32_in(dtype_ops):
    tt = opbuilder.to_torch(dtype_ops)
    x = torch.tensor([1.0, 1.00390625, -3.5])
    for _ in range(3):  # the direct path hands a bf16 result to torch too
        out = tt.to_bfloat16(x)
        assert out.dtype == torch.bfloat16
        assert out.tolist() == x.to(torch.bfloat16).tolist()


@pytest.mark.build
def test_to_torch_complex_gradcheck(dtype_ops):
    tt = opbuilder.to_torch(dtype_ops)
    x = torch.tensor(_z(1), dtype=torch.complex128, requires_grad=True)
    y = torch.tensor(_z(2), dtype=torch.complex128, requires_grad=True)
    assert torch.autograd.gradcheck(tt.mul, (x, y))


@pytest.mark.build
def test_to_torch_takes_a_conjugate_view(dtype_ops):
    tt = opbuilder.to_torch(dtype_ops)
    a, b = _z(1), _z(2)
    x = torch.tensor(a).conj()  # torch's lazy conjugate: numpy has no such view
    for _ in range(3):
        np.testing.assert_allclose(tt.mul(x, torch.tensor(b)).numpy(), np.conj(a) * b, rtol=1e-12)


@pytest.mark.build
def test_to_torch_complex_gradients_against_central_differences(dtype_ops):
    tt = opbuilder.to_torch(dtype_ops)
    a, b = _z(1), _z(2)

    def loss(x, y):
        return (tt.mul(x, y) - 1).abs().pow(2).sum()

    x = torch.tensor(a, requires_grad=True)
    loss(x, torch.tensor(b)).backward()

    def f(re, im):
        return loss(torch.tensor(re + 1j * im), torch.tensor(b)).item()

    want = central(lambda re: f(re, a.imag), a.real) + 1j * central(lambda im: f(a.real, im), a.imag)
    np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-6, atol=1e-7)


@pytest.mark.build
@pytest.mark.parametrize("name", ["uint16", "uint32", "uint64"])
def test_to_torch_unsigned_in_and_out(dtype_ops, name):
    tt = opbuilder.to_torch(dtype_ops)
    top = np.iinfo(name).max
    x = torch.from_numpy(np.array([0, 7, top], name))
    for _ in range(3):
        out = tt.add_one(x)
        assert out.dtype == getattr(torch, name)
        assert out.numpy().tolist() == [1, 8, 0]


@pytest.mark.build
def test_to_torch_refuses_float8_by_name(my_ops):
    tt = opbuilder.to_torch(my_ops)
    x = torch.ones(2, dtype=torch.float8_e4m3fn)
    with pytest.raises(TypeError, match=r"^mul: argument 0 has dtype torch\.float8_e4m3fn, which opbuilder's "
                                        r"runtime does not support \("):
        tt.mul(x, x)


# ---- to_jax ----

@pytest.mark.build
def test_to_jax_bfloat16_forward_and_gradients(dtype_ops):
    jj = opbuilder.to_jax(dtype_ops)
    a, b = _bf16(5), _bf16(6)
    out = jj.mul(jnp.asarray(a), jnp.asarray(b))
    assert out.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(out), (a.astype(np.float32) * b.astype(np.float32)).astype(BF16))
    np.testing.assert_array_equal(np.asarray(jax.jit(jj.mul)(jnp.asarray(a), jnp.asarray(b))), np.asarray(out))

    def grads(dtype):
        def loss(x, y):
            return jnp.sum(jj.mul(jj.mul(x, y), jj.mul(x, x)).astype(jnp.float32))
        return jax.grad(loss, argnums=(0, 1))(jnp.asarray(a, dtype), jnp.asarray(b, dtype))

    for lo, ref in zip(grads(jnp.bfloat16), grads(jnp.float32)):
        assert lo.dtype == jnp.bfloat16
        ref = np.asarray(ref)
        np.testing.assert_allclose(np.asarray(lo).astype(np.float32), ref, rtol=2 ** -6,
                                   atol=2 ** -6 * np.abs(ref).max())


@pytest.mark.build
def test_to_jax_complex_gradients_against_central_differences(dtype_ops):
    jj = opbuilder.to_jax(dtype_ops)
    a, b = _z(7), _z(8)

    def loss(x, y):
        return jnp.sum(jnp.abs(jj.mul(x, y) - 1) ** 2)

    out = jj.mul(jnp.asarray(a), jnp.asarray(b))
    np.testing.assert_allclose(np.asarray(out), a * b, rtol=1e-12)
    gx, gy = jax.grad(loss, argnums=(0, 1))(jnp.asarray(a), jnp.asarray(b))

    def f(z, other, first):
        return float(loss(jnp.asarray(z), jnp.asarray(other)) if first else loss(jnp.asarray(other), jnp.asarray(z)))

    for g, z0, other, first in [(gx, a, b, True), (gy, b, a, False)]:
        d_re = central(lambda re: f(re + 1j * z0.imag, other, first), z0.real)
        d_im = central(lambda im: f(z0.real + 1j * im, other, first), z0.imag)
        np.testing.assert_allclose(np.asarray(g), d_re - 1j * d_im, rtol=1e-6, atol=1e-7)  # JAX's convention


@pytest.mark.build
def test_to_jax_refuses_float8_by_name(my_ops):
    jj = opbuilder.to_jax(my_ops)
    a = jnp.ones(2, jnp.float8_e4m3fn)
    with pytest.raises(TypeError, match=r"^mul: argument 0 has dtype float8_e4m3fn, which opbuilder's runtime does "
                                        r"not support \(unsupported tensor dtype float8_e4m3fn; supported: "):
        jj.mul(a, a)
