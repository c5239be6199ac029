"""C++ operators called directly with other frameworks' tensors (torch, JAX, anything with
``__dlpack__``): the memory arrives without a copy, under the boundary rules (contiguous and
writable for a default Function, views on opt-in), and results are runtime.Tensors."""
from __future__ import annotations

import re

import numpy as np
import pytest

import runtime as rt
from runtime import Tensor
from runtime.cuda import unavailable_reason

torch = pytest.importorskip("torch", reason="torch is not installed")

pytestmark = pytest.mark.build


class OnlyDlpack:
    """Nothing but the DLPack protocol, over a numpy array."""

    def __init__(self, arr: np.ndarray) -> None:
        self._arr = arr

    def __dlpack__(self, **kw):
        return self._arr.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._arr.__dlpack_device__()


def test_a_torch_tensor_arrives_without_a_copy(dlpack_ops):
    x = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    assert dlpack_ops.address(x) == x.data_ptr()
    out = dlpack_ops.twice(x)
    assert dlpack_ops.seen() == (x.data_ptr(), True, True)  # the Function's Forward got x's memory
    assert type(out) is Tensor and not out.requires_grad
    np.testing.assert_array_equal(out.asnumpy(), 2 * x.numpy())
    back = dlpack_ops.identity(x)  # an input returned: a runtime.Tensor over the same memory
    assert type(back) is Tensor
    back.asnumpy()[0, 0] = 7.0
    assert x[0, 0].item() == 7.0


def test_a_torch_tensor_requiring_grad_is_taken_detached(dlpack_ops):
    x = torch.ones(5, dtype=torch.float64, requires_grad=True)
    assert dlpack_ops.address(x) == x.data_ptr()
    out = dlpack_ops.twice(x)
    assert dlpack_ops.seen()[0] == x.data_ptr()
    assert type(out) is Tensor and not out.requires_grad
    np.testing.assert_array_equal(out.asnumpy(), np.full(5, 2.0))
    assert x.requires_grad and x.grad is None  # torch's tensor is left as it was


def test_a_strided_torch_view_follows_the_boundary_rules(dlpack_ops):
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    v = base.t()[:, 1:]  # strided, starts one row in
    assert not v.is_contiguous()
    assert dlpack_ops.address(v) == v.data_ptr()  # a plain function gets the view as it is
    with pytest.raises(ValueError, match=r"data<T>\(\): the tensor is not contiguous \(shape \[6, 3\], "):
        dlpack_ops.first(v)
    out = dlpack_ops.twice(v)  # a default Function: a private contiguous copy
    address, contiguous, _ = dlpack_ops.seen()
    assert contiguous and address != v.data_ptr()
    np.testing.assert_array_equal(out.asnumpy(), 2 * v.numpy())
    out = dlpack_ops.twice_views(v)  # opted in to views: no copy
    assert dlpack_ops.seen() == (v.data_ptr(), False, True)
    np.testing.assert_array_equal(out.asnumpy(), 2 * v.numpy())


def test_a_jax_array_is_read_only_memory(dlpack_ops):
    jnp = pytest.importorskip("jax.numpy")
    jax = pytest.importorskip("jax")
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        x = jnp.asarray(np.arange(6.0).reshape(2, 3))
    finally:
        jax.config.update("jax_enable_x64", old)
    assert x.dtype == np.float64
    ptr = x.unsafe_buffer_pointer()
    assert dlpack_ops.address(x) == ptr
    out = dlpack_ops.twice_views(x)  # views on opt-in: the array as it is, read-only
    assert dlpack_ops.seen() == (ptr, True, False)
    np.testing.assert_array_equal(out.asnumpy(), 2 * np.asarray(x))
    out = dlpack_ops.twice(x)  # a default Function gets read-only memory as a private writable copy
    address, _, writable = dlpack_ops.seen()
    assert writable and address != ptr
    np.testing.assert_array_equal(out.asnumpy(), 2 * np.asarray(x))


def test_an_object_with_only_the_dlpack_protocol(dlpack_ops):
    arr = np.linspace(0.0, 1.0, 7)
    obj = OnlyDlpack(arr)
    assert dlpack_ops.address(obj) == arr.ctypes.data
    np.testing.assert_array_equal(dlpack_ops.twice(obj).asnumpy(), 2 * arr)
    assert dlpack_ops.seen()[0] == arr.ctypes.data


def test_dlpack_without_a_device_is_a_type_error(dlpack_ops):
    class NoDevice:
        def __dlpack__(self, **kw):
            raise AssertionError("not called")
    with pytest.raises(TypeError, match=r"from_dlpack needs an object with __dlpack__ and __dlpack_device__ "
                                        r"\(a numpy, torch, CuPy or JAX array\), got NoDevice"):
        dlpack_ops.twice(NoDevice())


@pytest.mark.skipif(unavailable_reason() is None, reason="a usable GPU takes CUDA memory")
def test_a_gpu_dlpack_object_without_a_usable_gpu_is_a_value_error(dlpack_ops):
    class OnCuda:
        def __dlpack__(self, **kw):
            raise AssertionError("not called")

        def __dlpack_device__(self):
            return (2, 1)
    why = unavailable_reason()
    with pytest.raises(ValueError, match=r"^opbuilder: an argument is a OnCuda on CUDA device 1, and this process "
                                         r"has no usable GPU \(" + re.escape(why) +
                                         r"\); pass a CPU tensor$"):
        dlpack_ops.address(OnCuda())


def test_a_device_the_runtime_has_not_is_a_value_error(dlpack_ops):
    class OnRocm:
        def __dlpack__(self, **kw):
            raise AssertionError("not called")

        def __dlpack_device__(self):
            return (10, 0)
    with pytest.raises(ValueError, match=r"from_dlpack: OnRocm lives on a ROCm device \(0\); this runtime has "
                                         r"CPU and CUDA tensors"):
        dlpack_ops.twice(OnRocm())


def test_runtime_tensors_and_numpy_arrays_are_unchanged(dlpack_ops):
    t = Tensor(np.arange(4.0))
    assert dlpack_ops.address(t) == t.asnumpy().ctypes.data
    arr = np.arange(4.0)
    assert dlpack_ops.address(arr) == arr.ctypes.data
    with pytest.raises(TypeError):  # no tensor at all: the binding's argument error, as before
        dlpack_ops.address("not a tensor")


# ---- runtime.from_dlpack and Tensor.__dlpack__: one version counter per memory, torch's export rules -----------

def test_from_dlpack_of_a_torch_tensor_shares_torchs_version_counter():
    """rt.from_dlpack(b.detach()) then a runtime write: torch's _version stayed 0, so b's backward used the
    changed values (attack on 07d2521). The write now bumps torch's counter, and torch refuses."""
    a = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    b = a.exp()  # exp saves its result
    r = rt.from_dlpack(b.detach())
    r += 1.0
    assert b._version == 1 and r._version == 1
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        b.sum().backward()
    with torch.inference_mode():
        frozen = torch.ones(3)
    f = rt.from_dlpack(frozen)  # torch lets nothing write an inference tensor outside InferenceMode
    f += 1.0
    assert frozen.tolist() == [1.0, 1.0, 1.0] and f.asnumpy().tolist() == [2.0, 2.0, 2.0]


def test_tensors_over_one_numpy_array_share_a_counter_whichever_way_made():
    """from_dlpack(arr) twice, or beside from_numpy(arr), made separate counters: a write through one was
    unseen by a backward that saved the other (attack on 07d2521)."""
    for make in (lambda arr: rt.from_dlpack(arr), rt.from_numpy):
        arr = np.ones(3, np.float32)
        x = Tensor(np.array([1.0, 2.0, 3.0], np.float32), requires_grad=True)
        saved, other = rt.from_dlpack(arr), make(arr)
        y = x * saved
        other += 1.0
        with pytest.raises(RuntimeError, match=r"^one of the tensors needed for gradient computation has been "
                                               r"modified by an in-place operation: argument 1 of mul is at version 1; "
                                               r"expected version 0"):
            y.sum().backward()


def test_dlpack_export_refuses_what_torch_refuses():
    """A tensor that requires grad was exported, and torch's writes to it went unseen by the backward that
    saved it; a view with negative strides was exported, and torch.from_dlpack aborted the process
    (attack on 07d2521). Both are BufferErrors now; detached and copied ones export."""
    x = Tensor(np.array([1.0, 2.0, 3.0], np.float32), requires_grad=True)
    y = rt.ops.exp(x)
    with pytest.raises(BufferError, match=r"^__dlpack__: a tensor that requires grad cannot be exported \(another "
                                          r"library's writes to it would go unseen by autograd\); export t.detach\(\)$"):
        torch.from_dlpack(y)
    assert torch.from_dlpack(y.detach()).tolist() == pytest.approx(np.exp([1.0, 2.0, 3.0]).tolist())
    rev = Tensor(np.arange(4.0))[::-1]
    with pytest.raises(BufferError, match=r"^__dlpack__: a view with negative strides \(-8,\) \(x\[::-1\]\) cannot "
                                          r"be exported: consumers \(torch\) mishandle them; export a copy"):
        torch.from_dlpack(rev)
    assert torch.from_dlpack(Tensor(rev.asnumpy().copy())).tolist() == [3.0, 2.0, 1.0, 0.0]
