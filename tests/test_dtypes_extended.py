"""bfloat16, complex64/128 and uint16/32/64 in the runtime (issue 23, dtypes): tensors, built-in ops,
autograd (complex gradients as PyTorch defines them: dL/dx + i dL/dy for a real loss L of z = x + iy,
checked by central differences in float64/complex128; bfloat16 against a float32 reference), checkpoints
(BF16 safetensors files written by hand per the format), and each bad input's exact error.
The C++ side (DataType, dispatch macros, aot ABI) is tests/test_dtypes_cpp.py."""
from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import runtime as rt
from runtime import Tensor
from runtime.ops import math as m
from numeric_util import central
from safetensors_util import safetensors_bytes  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BF16 = np.dtype(ml_dtypes.bfloat16)
NEW = [("bfloat16", BF16, "BFloat16"), ("complex64", np.complex64, "Complex64"),
       ("complex128", np.complex128, "Complex128"), ("uint16", np.uint16, "UInt16"),
       ("uint32", np.uint32, "UInt32"), ("uint64", np.uint64, "UInt64")]


# ---- the dtypes themselves ---------------------------------------------------------------------------
@pytest.mark.parametrize("name, np_dtype, display", NEW)
def test_each_new_dtype_maps_both_ways(name, np_dtype, display):
    d = getattr(rt, name)
    assert d.np == np.dtype(np_dtype) and repr(d) == display and d.name == name
    assert rt.ops.math.cast(Tensor(np.arange(3)), d).dtype is d
    assert Tensor(np.zeros(2, np_dtype)).dtype is d and Tensor([1, 2], name).dtype is d
    assert Tensor(np.zeros(2, np_dtype)).asnumpy().dtype == np.dtype(np_dtype)


def test_floating_and_complex_flags():
    assert rt.bfloat16.is_floating and not rt.bfloat16.is_complex
    assert rt.complex64.is_complex and not rt.complex64.is_floating
    assert not rt.uint64.is_floating and not rt.uint64.is_complex


def test_import_runtime_leaves_ml_dtypes_out_until_bfloat16_is_used():
    code = ("import sys, runtime as rt\nassert 'ml_dtypes' not in sys.modules, 'import'\n"
            "t = rt.Tensor([1.0, 2.0]) * 2\nassert 'ml_dtypes' not in sys.modules, 'float32 op'\n"
            "b = rt.Tensor([1.5], rt.bfloat16)\nassert 'ml_dtypes' in sys.modules\nprint(b.dtype)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "BFloat16"


def test_a_dtype_tensors_cannot_hold_lists_the_new_ones():
    with pytest.raises(TypeError, match=r"^unsupported tensor dtype float8_e4m3fn; supported: float16, bfloat16, "
                                        r"float32, float64, complex64, complex128, int8, int16, int32, int64, "
                                        r"uint8, uint16, uint32, uint64, bool$"):
        Tensor(np.zeros(2, ml_dtypes.float8_e4m3fn))


# ---- unsigned integers ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.uint64])
def test_unsigned_tensors_compute_and_keep_their_dtype(dtype):
    big = np.iinfo(dtype).max
    x = Tensor(np.array([1, 2, big - 3], dtype))
    y = Tensor(np.array([3, 1, 2], dtype))
    for got, want in [(x + y, [4, 3, big - 1]), (x * y, [3, 2, (int(big) - 3) * 2 % (int(big) + 1)])]:
        assert got.asnumpy().dtype == np.dtype(dtype)
        assert [int(v) for v in got.asnumpy()] == want
    assert int(m.sum(y).item()) == 6 and m.sum(y).dtype is rt.uint64  # numpy sums small unsigned ints in uint64
    assert m.less(y, x).asnumpy().tolist() == [False, True, True]


def test_an_unsigned_tensor_cannot_require_grad():
    with pytest.raises(TypeError, match=r"^only floating-point and complex tensors can require gradients, got "
                                        r"dtype UInt32$"):
        Tensor(np.ones(2, np.uint32)).requires_grad_()


# ---- complex -----------------------------------------------------------------------------------------------
def _z(shape, seed):
    r = np.random.default_rng(seed)
    return r.standard_normal(shape) + 1j * r.standard_normal(shape)


def test_complex_ops_match_numpy():
    a, b = _z((2, 3), 0), _z((3, 2), 1)
    x, y = Tensor(a, rt.complex128), Tensor(b, rt.complex128)
    np.testing.assert_allclose(m.matmul(x, y).asnumpy(), a @ b)
    np.testing.assert_allclose((x * 2.0 + 1j).asnumpy(), a * 2 + 1j)
    np.testing.assert_allclose(m.exp(x).asnumpy(), np.exp(a))
    np.testing.assert_allclose(m.abs(x).asnumpy(), np.abs(a))
    np.testing.assert_allclose(m.real(x).asnumpy(), a.real)
    np.testing.assert_allclose(m.imag(x).asnumpy(), a.imag)
    np.testing.assert_allclose(m.conj(x).asnumpy(), a.conj())
    assert (Tensor(a, rt.complex64) * 2.0).dtype is rt.complex64
    assert (Tensor(np.ones(2, np.float32)) * 1j).dtype is rt.complex64


def _numeric_complex_grad(f, z, eps=1e-6):
    """dL/dx + i dL/dy of a real f at z (complex128), by central differences."""
    gx = central(lambda re: f(re + 1j * z.imag), z.real, eps)
    gy = central(lambda im: f(z.real + 1j * im), z.imag, eps)
    return gx + 1j * gy


LOSSES = {
    "mul_conj_sin": lambda z, w: m.sum(m.real(m.mul(m.mul(m.exp(z), w), m.conj(m.sin(z))))),
    "abs_squared": lambda z, w: m.sum(m.abs(m.sub(m.mul(z, w), z)) ** 2),
    "div_log_imag": lambda z, w: m.mean(m.imag(m.log(m.div(w, m.add(z, 3.0))))),
    "matmul_tanh": lambda z, w: m.sum(m.real(m.tanh(m.matmul(m.reshape(z, (2, 2)), m.reshape(w, (2, 2)))))),
    "sqrt_pow_cos": lambda z, w: m.sum(m.imag(m.mul(m.sqrt(m.add(z, 4.0)), m.cos(m.pow(w, 2))))),
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_complex_gradients_are_pytorchs_convention_by_central_differences(name):
    loss = LOSSES[name]
    z0, w0 = _z(4, 2), _z(4, 3)
    z, w = Tensor(z0, rt.complex128), Tensor(w0, rt.complex128)
    value, (gz, gw) = rt.value_and_grad(loss, grad_position=(0, 1))(z, w)
    assert value.dtype is rt.float64 and gz.dtype is rt.complex128
    np.testing.assert_allclose(gz.asnumpy(), _numeric_complex_grad(
        lambda a: loss(Tensor(a, rt.complex128), w).item(), z0), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(gw.asnumpy(), _numeric_complex_grad(
        lambda a: loss(z, Tensor(a, rt.complex128)).item(), w0), rtol=1e-6, atol=1e-7)


def test_a_real_input_of_a_complex_op_gets_the_real_gradient():
    """Casting a real weight to complex (or multiplying it by a complex tensor) sends back Re(g)."""
    z0, r0 = _z(3, 4), np.random.default_rng(5).standard_normal(3)
    z = Tensor(z0, rt.complex128)

    def loss(r):
        return m.sum(m.abs(m.mul(m.cast(r, rt.complex128), z)) + m.real(m.mul(r, z)))

    g = rt.grad(loss)(Tensor(r0, rt.float64))
    assert g.dtype is rt.float64
    np.testing.assert_allclose(g.asnumpy(), central(lambda a: loss(Tensor(a, rt.float64)).item(), r0),
                               rtol=1e-6, atol=1e-7)


def test_complex_gradients_match_torch():
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")
    z0, w0 = _z(4, 6), _z(4, 7)
    loss = LOSSES["mul_conj_sin"]
    gz = rt.grad(loss)(Tensor(z0, rt.complex128), Tensor(w0, rt.complex128))
    tz = torch.tensor(z0, requires_grad=True)
    (torch.exp(tz) * torch.tensor(w0) * torch.conj(torch.sin(tz))).real.sum().backward()
    np.testing.assert_allclose(gz.asnumpy(), tz.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("op", ["relu", "less", "less_equal", "greater", "greater_equal"])
def test_an_op_that_orders_values_refuses_complex(op):
    z = Tensor(np.ones(2, np.complex64))
    args = (z,) if op == "relu" else (z, Tensor(np.ones(2, np.complex64)))
    with pytest.raises(TypeError, match=rf"^op '{op}' does not take complex tensors \(got Complex64\): complex "
                                        rf"numbers have no order$"):
        getattr(m, op)(*args)


def test_casting_complex_to_real_is_refused():
    with pytest.raises(TypeError, match=r"^cast from complex128 to float64 would drop the imaginary part; take "
                                        r"real\(x\) or abs\(x\) first$"):
        m.cast(Tensor(np.ones(2, np.complex128)), rt.float64)


# ---- bfloat16 ---------------------------------------------------------------------------------------------
def test_bfloat16_ops_round_their_float32_results():
    a = np.random.default_rng(8).standard_normal((3, 4)).astype(np.float32)
    b = np.random.default_rng(9).standard_normal((4, 2)).astype(np.float32)
    xb, yb = Tensor(a.astype(BF16)), Tensor(b.astype(BF16))
    for got, want in [(m.matmul(xb, yb), a.astype(BF16).astype(np.float32) @ b.astype(BF16).astype(np.float32)),
                      (m.sum(xb, axis=1), a.astype(BF16).astype(np.float32).sum(axis=1)),
                      (m.mean(xb), a.astype(BF16).astype(np.float32).mean()),
                      (m.exp(xb), np.exp(a.astype(BF16).astype(np.float32)))]:
        assert got.dtype is rt.bfloat16  # numpy's bf16 matmul would give float32
        np.testing.assert_array_equal(got.asnumpy(), np.asarray(want, np.float32).astype(BF16))
    assert (xb + Tensor(np.ones(4, np.int32))).dtype is rt.bfloat16  # the float operand's dtype wins
    assert (xb * 2.0).dtype is rt.bfloat16


def test_bfloat16_gradients_match_float32_within_bfloat16_precision():
    a = np.random.default_rng(10).standard_normal((3, 4)).astype(np.float32)
    w = np.random.default_rng(11).standard_normal((4, 2)).astype(np.float32)

    def loss(x, w):
        return m.sum(m.mul(m.tanh(m.matmul(x, w)), m.sigmoid(m.matmul(x, w))))

    g16 = rt.grad(loss, grad_position=(0, 1))(Tensor(a.astype(BF16)), Tensor(w.astype(BF16)))
    g32 = rt.grad(loss, grad_position=(0, 1))(Tensor(a.astype(BF16).astype(np.float32)),
                                               Tensor(w.astype(BF16).astype(np.float32)))
    for lo, ref in zip(g16, g32):
        assert lo.dtype is rt.bfloat16
        r = ref.asnumpy()
        # bfloat16 keeps 8 significant bits: a few roundings of 2^-8 relative each along the chain
        np.testing.assert_allclose(lo.asnumpy().astype(np.float32), r, rtol=0.05, atol=0.05 * np.abs(r).max())


# ---- checkpoints ----------------------------------------------------------------------------------------


def test_a_bf16_checkpoint_written_by_hand_loads_as_bfloat16(tmp_path):
    values = np.array([[1.0, -2.5, 3.140625], [0.0, 1e-3, -65280.0]], np.float32)
    raw = (values.view(np.uint32) >> 16).astype("<u2").tobytes()  # exact in bf16: the top 16 bits
    path = tmp_path / "torch_bf16.safetensors"
    path.write_bytes(safetensors_bytes({"w": ("BF16", [2, 3], raw), "n": ("U16", [2], b"\x01\x00\xff\xff")}))
    params = rt.load_checkpoint(path)
    w = params["w"]
    assert w.dtype is rt.bfloat16 and w.requires_grad and w.shape == (2, 3)
    np.testing.assert_array_equal(w.asnumpy().astype(np.float32), values.astype(BF16).astype(np.float32))
    assert params["n"].dtype is rt.uint16 and params["n"].asnumpy().tolist() == [1, 65535]


def test_bf16_complex64_and_unsigned_round_trip_through_a_checkpoint(tmp_path):
    tensors = {"b": np.array([1.5, -3.0, 1e30], np.float32).astype(BF16), "c": _z(3, 12).astype(np.complex64),
               "u": np.array([2 ** 64 - 1, 7], np.uint64), "v": np.array([2 ** 32 - 1], np.uint32)}
    path = tmp_path / "rt.safetensors"
    rt.save_checkpoint(tensors, path)
    header = json.loads(path.read_bytes()[8:8 + struct.unpack("<Q", path.read_bytes()[:8])[0]])
    assert {k: header[k]["dtype"] for k in tensors} == {"b": "BF16", "c": "C64", "u": "U64", "v": "U32"}
    back = rt.load_checkpoint(path)
    for k, a in tensors.items():
        assert back[k].asnumpy().dtype == a.dtype
        np.testing.assert_array_equal(back[k].asnumpy(), a)
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")
    from safetensors.torch import load_file
    assert load_file(str(path))["b"].dtype == torch.bfloat16  # PyTorch reads what this wrote


def test_a_bf16_file_saved_by_torch_loads():
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")
    from safetensors.torch import save
    t = torch.tensor([0.1, -7.25, 3e38], dtype=torch.bfloat16)
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "t.safetensors")
        with open(p, "wb") as f:
            f.write(save({"t": t}))
        got = rt.load_checkpoint(p)["t"]
    assert got.dtype is rt.bfloat16
    np.testing.assert_array_equal(got.asnumpy().astype(np.float32), t.float().numpy())


def test_saving_complex128_is_refused_before_writing(tmp_path):
    path = tmp_path / "c.safetensors"
    with pytest.raises(TypeError, match=r"^save_checkpoint: 'c' is complex128, which the safetensors format cannot "
                                        r"hold \(its only complex dtype is C64\); cast it to complex64 or save its "
                                        r"real and imaginary parts. Nothing was written$"):
        rt.save_checkpoint({"c": np.ones(2, np.complex128)}, path)
    assert not path.exists() and os.listdir(tmp_path) == []


def test_softmax_and_an_optimizer_step_take_bfloat16():
    a = np.random.default_rng(13).standard_normal((2, 5)).astype(np.float32).astype(BF16)
    s = rt.ops.softmax(Tensor(a))
    assert s.dtype is rt.bfloat16
    e = np.exp(a.astype(np.float32) - a.astype(np.float32).max(axis=-1, keepdims=True))
    np.testing.assert_allclose(s.asnumpy().astype(np.float32), e / e.sum(axis=-1, keepdims=True),
                               rtol=2 ** -5)  # a few bf16 roundings
    p = rt.Parameter(np.ones(3, BF16), name="p")
    opt = rt.nn.SGD([p], learning_rate=0.5)
    _, gw = rt.grad(lambda x: m.sum(m.mul(m.mul(p, p), x)), grad_position=0, weights=[p])(Tensor(np.ones(3, BF16)))
    assert gw[0].dtype is rt.bfloat16 and gw[0].asnumpy().astype(np.float32).tolist() == [2.0, 2.0, 2.0]
    opt(gw)  # p - 0.5 * 2p
    assert p.dtype is rt.bfloat16 and p.asnumpy().astype(np.float32).tolist() == [0.0, 0.0, 0.0]


def test_softmax_refuses_complex():
    with pytest.raises(TypeError, match=r"^softmax needs a floating-point tensor, got Complex64; cast it first$"):
        rt.ops.softmax(Tensor(np.ones(2, np.complex64)))


def test_jit_gradients_of_complex_and_bfloat16_match_eager():
    """A jit function's backward (its graph's nodes, attach_outputs) treats complex and bf16 as differentiable."""
    def loss(x, w):
        return m.sum(m.real(m.mul(m.tanh(x), m.conj(w))))

    z, w = Tensor(_z(3, 14), rt.complex128), Tensor(_z(3, 15), rt.complex128)
    eager = rt.grad(loss, grad_position=(0, 1))(z, w)
    traced = rt.grad(rt.jit(loss), grad_position=(0, 1))(z, w)
    for e, t in zip(eager, traced):
        np.testing.assert_allclose(t.asnumpy(), e.asnumpy(), rtol=1e-12)
        assert np.abs(t.asnumpy()).min() > 0
    b = Tensor(np.array([1.5, -2.5, 0.25], np.float32).astype(BF16))
    f = lambda x: m.sum(m.mul(m.tanh(x), x))  # noqa: E731
    np.testing.assert_array_equal(rt.grad(rt.jit(f))(b).asnumpy(), rt.grad(f)(b).asnumpy())
    assert rt.grad(rt.jit(f))(b).dtype is rt.bfloat16 and np.abs(rt.grad(f)(b).asnumpy().astype(np.float32)).min() > 0


ORDERING = {  # case: (call, the op's name in the error)
    "max": (lambda t: rt.mint.max(t), "max"), "max_dim": (lambda t: rt.mint.max(t, 1), "max"),
    "min": (lambda t: rt.ops.min(t), "min"), "argmax": (lambda t: rt.mint.argmax(t), "argmax"),
    "argmin_dim": (lambda t: rt.mint.argmin(t, 1), "argmin"), "maximum": (lambda t: rt.mint.maximum(t, t), "maximum"),
    "minimum": (lambda t: rt.mint.minimum(t, t), "minimum"),
    "div_floor": (lambda t: rt.mint.div(t, t, rounding_mode="floor"), "div(rounding_mode='floor')"),
}


@pytest.mark.parametrize("case", sorted(ORDERING))
def test_reductions_and_rounding_that_order_values_refuse_complex(case):
    call, op = ORDERING[case]
    z = Tensor(_z((2, 2), 16).astype(np.complex64))
    with pytest.raises(TypeError, match="^" + re.escape(f"op '{op}' does not take complex tensors (got Complex64): "
                                                        f"complex numbers have no order") + "$"):
        call(z)
    b = Tensor(np.array([[1.5, -2.5], [4.0, 0.25]], np.float32).astype(BF16))  # bf16 has an order: it works
    assert call(b) is not None
    assert float(rt.mint.max(b).item()) == 4.0 and int(rt.mint.argmax(b).item()) == 2


def test_print_shows_bfloat16_values_as_floats(capsys):
    rt.ops.print_(Tensor(np.array([1.5, -2.0], np.float32).astype(BF16)), Tensor(np.array([1 + 2j], np.complex64)))
    assert capsys.readouterr().out.splitlines() == [
        "Tensor(shape=[2], dtype=BFloat16, value= [ 1.50000000e+00, -2.00000000e+00])",
        "Tensor(shape=[1], dtype=Complex64, value= [1.+2.j])"]


def test_the_gradient_of_a_complex_abs_is_z_over_abs_z_and_zero_at_zero():
    g = rt.grad(lambda z: m.sum(m.abs(z)))(Tensor(np.array([0, 3 + 4j, -2j], np.complex128)))
    np.testing.assert_allclose(g.asnumpy(), [0, 0.6 + 0.8j, -1j], rtol=1e-15)
