"""``runtime.Tensor.__dlpack__`` for every runtime dtype, bfloat16 included (issue 23, interop).

numpy's own ``__dlpack__`` refuses ml_dtypes' bfloat16, so a bf16 tensor is exported as a uint16
view whose capsule says bfloat16. The capsules are read here with ctypes structures written from
dlpack.h (independent of the runtime's), then torch and JAX consume them: the same memory (data
pointers compared), the same bits, writes through torch seen by the runtime, and the memory kept
until the consumer lets go. The array API standard's ``copy``, ``dl_device`` and ``stream``
keywords and the read-only flag of DLPack 1.x behave as for numpy's own dtypes.
"""
from __future__ import annotations

import ctypes
import gc
import re
import weakref

import ml_dtypes
import numpy as np
import pytest

import runtime as rt
from runtime import Tensor

BF16 = np.dtype(ml_dtypes.bfloat16)
KDL_INT, KDL_UINT, KDL_FLOAT, KDL_BFLOAT, KDL_COMPLEX, KDL_BOOL = 0, 1, 2, 4, 5, 6
READ_ONLY, IS_COPIED = 1 << 0, 1 << 1  # DLPACK_FLAG_BITMASK_*


# ---- dlpack.h, as ctypes structures ----

class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


_get_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", ctypes.pythonapi))
_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))


def read_capsule(cap) -> dict:
    """What an unconsumed DLPack capsule says: its name, version, flags and DLTensor fields."""
    name = _get_name(cap)
    address = _get_pointer(cap, name)
    if name == b"dltensor":
        managed, version, flags = DLManagedTensor.from_address(address), None, None
    else:
        assert name == b"dltensor_versioned"
        managed = DLManagedTensorVersioned.from_address(address)
        version, flags = (managed.major, managed.minor), managed.flags
    t = managed.dl_tensor
    return {"name": name.decode(), "version": version, "flags": flags, "data": t.data or 0,
            "device": (t.device.device_type, t.device.device_id),
            "dtype": (t.dtype.code, t.dtype.bits, t.dtype.lanes), "shape": tuple(t.shape[i] for i in range(t.ndim)),
            "strides": tuple(t.strides[i] for i in range(t.ndim)) if t.strides else None,
            "byte_offset": t.byte_offset}


def bf16_tensor(bits: np.ndarray, align: int = 64) -> Tensor:
    """A runtime bf16 tensor over fresh memory aligned to ``align`` bytes (XLA shares only 64-byte
    aligned buffers), holding the given uint16 bit patterns."""
    raw = np.empty(bits.nbytes + align, np.uint8)
    start = (-raw.ctypes.data) % align
    buf = raw[start:start + bits.nbytes].view(np.uint16).reshape(bits.shape)
    buf[...] = bits
    return rt.from_numpy(buf.view(BF16))


def random_bits(shape, seed=0) -> np.ndarray:
    """Every kind of bf16 value: normal, subnormal, zeros of both signs, infinities, NaNs with payloads."""
    return np.random.default_rng(seed).integers(0, 1 << 16, size=shape, dtype=np.uint16)


@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason="torch is not installed")


@pytest.fixture
def jax():
    """JAX with 64-bit arrays for the test (uint64, complex128), restored after."""
    jax = pytest.importorskip("jax", reason="jax is not installed")
    pytest.importorskip("jax.numpy")
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield jax
    jax.config.update("jax_enable_x64", old)


# ---- the capsules ----

@pytest.mark.parametrize("max_version", [None, (1, 0), (1, 3)])
def test_a_bfloat16_tensor_exports_a_capsule_that_says_bfloat16(max_version):
    r = bf16_tensor(random_bits((2, 3)))
    c = read_capsule(r.__dlpack__(max_version=max_version))
    assert c["dtype"] == (KDL_BFLOAT, 16, 1)
    assert c["data"] + c["byte_offset"] == r._data.ctypes.data  # the tensor's memory, not a copy
    assert c["device"] == (1, 0) and r.__dlpack_device__() == (1, 0)
    assert c["shape"] == (2, 3) and c["strides"] in (None, (3, 1))
    if max_version is None:  # a consumer that names no version gets DLPack 0.x's struct
        assert c["name"] == "dltensor"
    else:
        assert c["name"] == "dltensor_versioned" and c["version"][0] == 1 and c["flags"] == 0


def test_a_strided_bfloat16_view_exports_its_strides():
    base = bf16_tensor(random_bits((4, 6)))
    view = rt.from_numpy(base._data[1:, ::2])
    c = read_capsule(view.__dlpack__(max_version=(1, 0)))
    assert c["shape"] == (3, 3) and c["strides"] == (6, 2)  # in elements
    assert c["data"] + c["byte_offset"] == view._data.ctypes.data == base._data.ctypes.data + 6 * 2


@pytest.mark.parametrize("shape", [(), (0,), (2, 0, 3)])
def test_zero_d_and_empty_bfloat16_tensors_export(shape):
    r = Tensor(np.zeros(shape, BF16))
    for max_version in (None, (1, 0)):
        c = read_capsule(r.__dlpack__(max_version=max_version))
        assert c["dtype"] == (KDL_BFLOAT, 16, 1) and c["shape"] == shape


@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float32)])
def test_a_read_only_tensor_exports_only_with_the_read_only_flag(dtype):
    """As numpy does for its own dtypes: DLPack 1.x's flag says read-only; DLPack 0.x cannot say it."""
    arr = np.zeros(3, dtype)
    arr.flags.writeable = False
    r = rt.from_numpy(arr)
    c = read_capsule(r.__dlpack__(max_version=(1, 0)))
    assert c["flags"] & READ_ONLY and c["data"] == arr.ctypes.data
    assert c["dtype"][0] == (KDL_BFLOAT if dtype == BF16 else KDL_FLOAT)
    with pytest.raises(BufferError, match=r"^Cannot export readonly array since signalling readonly is unsupported "
                                          r"by DLPack \(supported by newer DLPack version\)\.$"):
        r.__dlpack__()


def test_copy_true_exports_a_copy_and_says_so():
    r = bf16_tensor(random_bits(5))
    c = read_capsule(r.__dlpack__(max_version=(1, 0), copy=True))
    assert c["flags"] & IS_COPIED and c["data"] != r._data.ctypes.data and c["dtype"] == (KDL_BFLOAT, 16, 1)
    got = np.ctypeslib.as_array(ctypes.cast(c["data"], ctypes.POINTER(ctypes.c_uint16)), (5,)).copy()
    np.testing.assert_array_equal(got, r._data.view(np.uint16))
    c = read_capsule(r.__dlpack__(max_version=(1, 0), copy=False))
    assert c["flags"] == 0 and c["data"] == r._data.ctypes.data


def test_dl_device_and_stream_follow_the_array_api():
    r = bf16_tensor(random_bits(3))
    c = read_capsule(r.__dlpack__(dl_device=(1, 0)))  # the CPU: the tensor's own memory
    assert c["data"] == r._data.ctypes.data and c["dtype"] == (KDL_BFLOAT, 16, 1)
    with pytest.raises(BufferError, match=r"^unsupported device requested$"):  # a device the producer cannot handle
        r.__dlpack__(dl_device=(2, 0))
    for t in (r, rt.Tensor([1.0, 2.0])):  # the CPU has no streams: one error whatever numpy's version says
        with pytest.raises(ValueError, match=r"^__dlpack__: a CPU tensor has no streams: stream must be None, "
                                             r"got 1$"):
            t.__dlpack__(stream=1)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'device'"):  # consumers retry without it
        r.__dlpack__(device=(1, 0))


@pytest.mark.parametrize("name, code, bits", [
    ("bool", KDL_BOOL, 8), ("int8", KDL_INT, 8), ("float16", KDL_FLOAT, 16), ("uint16", KDL_UINT, 16),
    ("uint32", KDL_UINT, 32), ("uint64", KDL_UINT, 64), ("complex64", KDL_COMPLEX, 64),
    ("complex128", KDL_COMPLEX, 128)])
def test_numpy_dtypes_export_as_numpy_does(name, code, bits):
    r = Tensor(np.arange(4).astype(name))
    for max_version in (None, (1, 0)):
        c = read_capsule(r.__dlpack__(max_version=max_version))
        assert c["dtype"] == (code, bits, 1) and c["data"] == r._data.ctypes.data


@pytest.mark.parametrize("dtype", [np.dtype(ml_dtypes.int4), np.dtype([("a", np.float32)])])
def test_a_dtype_dlpack_cannot_carry_is_a_buffer_error_naming_it(dtype):
    """Not a dtype a tensor is made with (the constructors refuse them): an op's raw result."""
    r = Tensor._from_array(np.zeros(2, dtype))
    with pytest.raises(BufferError, match=rf"^__dlpack__: a tensor of dtype {re.escape(str(dtype))} cannot be "
                                          r"exported: DLPack has no such type \(the runtime exports bool, integers, "
                                          r"floats, bfloat16 and complex\)$"):
        r.__dlpack__(max_version=(1, 0))


def test_the_capsule_keeps_the_memory_until_its_deleter_runs():
    r = Tensor(np.ones(4, BF16))
    alive = weakref.ref(r._data)
    cap = r.__dlpack__()
    del r
    gc.collect()
    assert alive() is not None  # the capsule holds it
    del cap  # never consumed: its destructor runs the deleter
    gc.collect()
    assert alive() is None


def test_runtime_from_dlpack_of_a_bfloat16_tensor_shares_its_memory():
    r = bf16_tensor(random_bits(4))
    back = rt.from_dlpack(r)
    assert back.dtype is rt.bfloat16 and back._data.ctypes.data == r._data.ctypes.data


# ---- torch ----

def test_torch_takes_a_bfloat16_tensor_without_a_copy(torch):
    bits = random_bits((3, 5), seed=1)
    r = bf16_tensor(bits)
    t = torch.from_dlpack(r)
    assert t.dtype == torch.bfloat16 and t.shape == (3, 5) and t.device.type == "cpu"
    assert t.data_ptr() == r._data.ctypes.data
    np.testing.assert_array_equal(t.view(torch.uint16).numpy(), bits)  # bit for bit, NaN payloads included
    t[1, 2] = -3.5
    assert float(r._data[1, 2]) == -3.5  # one memory
    t2 = torch.utils.dlpack.from_dlpack(r.__dlpack__())  # the legacy capsule, as an old consumer takes it
    assert t2.dtype == torch.bfloat16 and t2.data_ptr() == r._data.ctypes.data


def test_torch_copy_and_device_arguments(torch):
    r = bf16_tensor(random_bits(6, seed=2))
    t = torch.from_dlpack(r, copy=True)
    assert t.data_ptr() != r._data.ctypes.data
    np.testing.assert_array_equal(t.view(torch.uint16).numpy(), r._data.view(np.uint16))
    t = torch.from_dlpack(r, device="cpu", copy=False)
    assert t.data_ptr() == r._data.ctypes.data


def test_a_torch_tensor_outlives_the_runtime_tensor(torch):
    r = Tensor(np.arange(6, dtype=np.float32).astype(BF16))
    alive = weakref.ref(r._data)
    t = torch.from_dlpack(r)
    del r
    gc.collect()
    t.mul_(2)  # writes to the memory the runtime tensor had
    assert t.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    assert alive() is not None
    del t  # torch runs the capsule's deleter: the memory goes
    gc.collect()
    assert alive() is None


def test_torch_takes_a_strided_bfloat16_view_with_its_strides(torch):
    base = bf16_tensor(random_bits((4, 6), seed=3))
    view = rt.from_numpy(base._data.T[::2])
    t = torch.from_dlpack(view)
    assert t.shape == (3, 4) and t.stride() == (2, 6) and t.data_ptr() == view._data.ctypes.data
    np.testing.assert_array_equal(t.view(torch.uint16).numpy(), view._data.view(np.uint16))


def test_torch_takes_zero_d_and_empty_bfloat16_tensors(torch):
    t = torch.from_dlpack(Tensor(np.array(2.5, BF16)))
    assert t.dtype == torch.bfloat16 and t.shape == () and t.item() == 2.5
    t = torch.from_dlpack(Tensor(np.zeros((2, 0), BF16)))
    assert t.dtype == torch.bfloat16 and t.shape == (2, 0)


@pytest.mark.parametrize("name", ["uint16", "uint32", "uint64", "complex64", "complex128"])
def test_torch_takes_the_other_new_dtypes_without_a_copy(torch, name):
    r = Tensor((np.arange(1, 5) * (1 + 1j if name.startswith("complex") else 1)).astype(name))
    t = torch.from_dlpack(r)
    assert t.dtype == getattr(torch, name) and t.data_ptr() == r._data.ctypes.data
    np.testing.assert_array_equal(t.numpy(), r._data)


@pytest.mark.build
def test_a_cpp_ops_bfloat16_result_reaches_torch_without_a_copy(torch, dtype_ops):
    out = dtype_ops.to_bfloat16(Tensor(np.array([1.0, 1.00390625, -3.5], np.float32)))
    assert type(out) is Tensor and out.dtype is rt.bfloat16
    t = torch.from_dlpack(out)
    assert t.data_ptr() == out._data.ctypes.data
    assert t.tolist() == torch.tensor([1.0, 1.00390625, -3.5]).to(torch.bfloat16).tolist()


# ---- JAX ----

def test_jax_takes_a_bfloat16_tensor_without_a_copy(jax):
    bits = random_bits((4, 8), seed=4)
    r = bf16_tensor(bits)
    for take in (jax.numpy.from_dlpack, jax.dlpack.from_dlpack):
        a = take(r, copy=False)
        assert a.dtype == jax.numpy.bfloat16 and a.shape == (4, 8)
        assert a.unsafe_buffer_pointer() == r._data.ctypes.data
        np.testing.assert_array_equal(np.asarray(a).view(np.uint16), bits)


def test_a_jax_array_outlives_the_runtime_tensor(jax):
    bits = random_bits(16, seed=5)
    r = bf16_tensor(bits)
    a = jax.numpy.from_dlpack(r, copy=False)
    del r
    gc.collect()
    np.testing.assert_array_equal(np.asarray(a).view(np.uint16), bits)
    np.testing.assert_array_equal(np.asarray(a + 0).view(np.uint16), np.asarray(a).view(np.uint16))


def test_jax_takes_a_transposed_bfloat16_view_and_refuses_a_gapped_one(jax):
    base = bf16_tensor(random_bits((4, 6), seed=6))
    a = jax.numpy.from_dlpack(rt.from_numpy(base._data.T))
    np.testing.assert_array_equal(np.asarray(a).view(np.uint16), base._data.T.view(np.uint16))
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"Only DLPack tensors with trivial \(compact\) striding "
                                                         r"are supported"):
        jax.numpy.from_dlpack(rt.from_numpy(base._data[:, ::2]))


def test_jax_takes_zero_d_and_empty_bfloat16_tensors(jax):
    a = jax.numpy.from_dlpack(Tensor(np.array(-0.75, BF16)))
    assert a.dtype == jax.numpy.bfloat16 and a.shape == () and float(a) == -0.75
    assert jax.numpy.from_dlpack(Tensor(np.zeros((0, 3), BF16))).shape == (0, 3)


@pytest.mark.parametrize("name", ["uint16", "uint32", "uint64", "complex64", "complex128"])
def test_jax_takes_the_other_new_dtypes(jax, name):
    r = Tensor((np.arange(1, 5) * (1 + 1j if name.startswith("complex") else 1)).astype(name))
    a = jax.numpy.from_dlpack(r)
    assert a.dtype == np.dtype(name)
    np.testing.assert_array_equal(np.asarray(a), r._data)
