"""Devices on a machine without a usable GPU: names, errors, runtime.cuda's answers, DLPack on the CPU,
and a CPU run that never imports CuPy."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import runtime as rt
from runtime import Tensor
from runtime.device import DeviceMismatchError, check_same, parse_device

from builder_util import child_env

NO_GPU = rt.cuda.unavailable_reason()
needs_no_gpu = pytest.mark.skipif(NO_GPU is None, reason="a GPU is usable here; tests/test_gpu_*.py cover it")


@pytest.mark.parametrize("spec, want", [("CPU", "CPU"), ("cpu", "CPU"), (" CPU ", "CPU"), ("cpu:0", "CPU"),
                                        ("GPU", "GPU:0"), ("gpu:1", "GPU:1"), ("cuda", "GPU:0"),
                                        ("cuda:3", "GPU:3"), ("CUDA:0", "GPU:0")])
def test_device_names_parse_to_cpu_or_gpu_n(spec, want):
    assert parse_device(spec) == want


def test_a_bare_gpu_is_the_contexts_device_id():
    try:
        rt.set_context(device_id=2)
        assert parse_device("GPU") == parse_device("cuda") == "GPU:2"
    finally:
        rt.set_context(device_id=0)


@pytest.mark.parametrize("spec", ["tpu", "GPU:", "GPU:-1", "cuda:x", "GPU0", "", "cpu:1"])
def test_a_malformed_device_name_is_a_value_error_listing_the_forms(spec):
    with pytest.raises(ValueError, match=r"device .* (is not a device name; accepted: 'CPU', 'GPU', 'GPU:N', "
                                         r"'cuda', 'cuda:N'|there is one CPU device)"):
        Tensor([1.0], device=spec)


@pytest.mark.parametrize("spec", [0, None.__class__, ("GPU", 0)])
def test_a_device_that_is_not_a_string_is_a_type_error(spec):
    with pytest.raises(TypeError, match=r"device must be a string \('CPU', 'GPU', 'GPU:N', 'cuda', 'cuda:N'\), "
                                        r"got (int|type|tuple)"):
        parse_device(spec)


def test_cpu_tensors_say_cpu_and_moving_to_the_cpu_is_the_same_tensor():
    t = Tensor([1.0, 2.0], device="cpu")
    assert t.device == "CPU" and (t * 2).device == "CPU"
    assert t.to("CPU") is t and t.move_to("CPU") is t and t.to("cuda".replace("cuda", "cpu")) is t
    c = rt.Tensor(t, device="CPU")  # a constructor copies (as torch.tensor); to() above is the no-copy move
    assert c.tolist() == t.tolist() and not np.shares_memory(c.asnumpy(), t.asnumpy())


def test_the_positional_third_argument_is_the_device():
    t = Tensor([1, 2], rt.float64, "CPU")
    assert t.device == "CPU" and t.dtype == rt.float64


@needs_no_gpu
def test_runtime_cuda_answers_without_raising():
    assert rt.cuda.is_available() is False and rt.cuda.device_count() == 0
    assert rt.cuda.unavailable_reason() == NO_GPU
    assert NO_GPU.startswith(("CuPy is not installed", "CuPy could not be imported", "no CUDA device",
                              "no NVIDIA driver is installed", "the NVIDIA driver is too old",
                              "CUDA could not be initialised", "CuPy cannot load the CUDA libraries"))


@needs_no_gpu
@pytest.mark.parametrize("call", [lambda: rt.cuda.current_stream(), lambda: rt.cuda.Stream(),
                                  lambda: rt.cuda.synchronize()])
def test_streams_without_a_gpu_are_a_value_error_saying_why(call):
    with pytest.raises(ValueError, match=r"^no usable GPU: " + __import__("re").escape(NO_GPU)):
        call()


@needs_no_gpu
@pytest.mark.parametrize("make", [lambda: Tensor([1.0], device="GPU"), lambda: Tensor([1.0]).to("cuda:0"),
                                  lambda: Tensor([1.0]).move_to("GPU")])
def test_a_tensor_on_a_gpu_that_is_not_usable_is_a_value_error_saying_why(make):
    with pytest.raises(ValueError, match=r"^device GPU:0 is not usable: " + __import__("re").escape(NO_GPU)):
        make()


def test_cpu_tensors_have_no_cuda_array_interface():
    t = Tensor([1.0])
    assert not hasattr(t, "__cuda_array_interface__")
    with pytest.raises(AttributeError, match="a CPU tensor has no __cuda_array_interface__"):
        t.__cuda_array_interface__


def test_tensors_on_one_device_pass_the_device_check():
    check_same([Tensor([1.0]), Tensor([2.0]), 3.0], "op 'add'")  # numbers carry no device
    assert issubclass(DeviceMismatchError, RuntimeError)


# ---- DLPack on the CPU (numpy speaks it) ---------------------------------------------------------------
def test_from_dlpack_shares_a_numpy_arrays_memory():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = rt.from_dlpack(a)
    assert isinstance(t, Tensor) and t.shape == (2, 3) and t.dtype == rt.float32 and t.device == "CPU"
    a[1, 2] = 42.0
    assert t.asnumpy()[1, 2] == 42.0 and np.shares_memory(t.asnumpy(), a)


def test_numpy_takes_a_tensor_through_dlpack_without_copying():
    t = Tensor(np.ones((3, 4), np.float64))
    assert t.__dlpack_device__() == (1, 0)
    a = np.from_dlpack(t)
    assert np.shares_memory(a, t.asnumpy())
    a[0, 0] = -1.0
    assert t.asnumpy()[0, 0] == -1.0


def test_a_dlpack_round_trip_keeps_memory_views_and_gradients_work_on_the_result():
    base = np.arange(12, dtype=np.float64).reshape(3, 4)[:, 1:3]  # a strided view
    t = rt.from_dlpack(rt.from_dlpack(base))
    assert np.shares_memory(t.asnumpy(), base) and t.asnumpy().strides == base.strides
    x = rt.from_dlpack(np.array([1.0, 2.0, 3.0])).requires_grad_()
    (x * x).sum().backward()
    assert x.grad.asnumpy().tolist() == [2.0, 4.0, 6.0]


def test_from_dlpack_of_something_without_dlpack_is_a_type_error():
    with pytest.raises(TypeError, match=r"from_dlpack needs an object with __dlpack__ and __dlpack_device__ "
                                        r"\(a numpy, torch, CuPy or JAX array\), got list"):
        rt.from_dlpack([1.0, 2.0])


def test_from_dlpack_of_complex_and_unsigned_shares_memory():
    """complex128 was this test's unsupported dtype; every dtype numpy exports through DLPack is a tensor
    dtype now (issue 23), so the from_dlpack TypeError has no CPU example left."""
    for dtype in (np.complex128, np.complex64, np.uint16, np.uint32, np.uint64):
        a = np.zeros(2, dtype)
        t = rt.from_dlpack(a)
        a[1] = 3
        assert t.dtype.np == np.dtype(dtype) and t.asnumpy()[1] == 3


class _RocmArray:
    """A producer on a device this runtime does not have (its capsule is never asked for)."""

    def __dlpack__(self, **kwargs):
        raise AssertionError("not reached")

    def __dlpack_device__(self):
        return (10, 1)


def test_from_dlpack_of_another_device_type_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match=r"from_dlpack: _RocmArray lives on a ROCm device \(1\); this runtime "
                                         r"has CPU and CUDA tensors"):
        rt.from_dlpack(_RocmArray())


# ---- the CPU path never loads CuPy ---------------------------------------------------------------------
def test_importing_runtime_and_running_cpu_work_never_imports_cupy():
    script = textwrap.dedent("""
        import sys
        import numpy as np
        import runtime as rt
        from runtime import Tensor, nn
        rt.set_context(device_target="CPU", device_id=0)
        x = Tensor([[1.0, 2.0]], device="CPU")
        net = nn.Dense(2, 3)
        out, grads = rt.value_and_grad(lambda a: (net(a) ** 2).sum(), 0, net.trainable_params())(x)
        t = rt.from_dlpack(np.ones(3)) + Tensor(1.0).to("cpu")
        print(x.device, t.device, float(out) > 0, len(grads[1]), "cupy" in sys.modules, "cupyx" in sys.modules)
    """)
    res = subprocess.run([sys.executable, "-c", script], env=child_env(), capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["CPU", "CPU", "True", "2", "False", "False"]
