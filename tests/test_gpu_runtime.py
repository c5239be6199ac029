"""On a GPU (``python -m pytest -m gpu``): seed 004 as written, a .cu Function op gradient-checked on the
device, built-in ops and an MLP matching the CPU, streams, DLPack with CuPy and torch.

Skipped with the reason (no CuPy, no device, driver too old) where no GPU is usable.
"""
import subprocess
from pathlib import Path

import numpy as np
import pytest

import runtime as rt
from runtime import Tensor, nn, ops

from builder_util import cuda_toolkit_problem
from conftest import _load

HERE = Path(__file__).resolve().parent
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not rt.cuda.is_available(), reason=f"no usable GPU: {rt.cuda.unavailable_reason()}")]


@pytest.fixture(scope="session")
def nvcc():
    """nvcc's path; the tests that build CUDA code skip, saying why, on a GPU machine without the toolkit."""
    problem = cuda_toolkit_problem()
    if problem:
        pytest.skip(problem)
    from opbuilder.toolchain import find_nvcc
    return find_nvcc(None).path


@pytest.fixture(scope="session")
def cuda_ops(cache_dir, nvcc):
    return _load("cuda_function_ops", [HERE / "cuda" / "cuda_function_ops.cu"], backend="GPU")


@pytest.fixture(scope="session")
def seed_so(tmp_path_factory, nvcc):
    out = tmp_path_factory.mktemp("seed004_gpu") / "custom_add.so"
    subprocess.run([nvcc, "--shared", "-Xcompiler", "-fPIC", "-o", str(out),
                    str(HERE / "cuda" / "seed004_custom_add.cu")], check=True, timeout=300)
    return out


@pytest.fixture
def gpu_context():
    rt.set_context(device_target="GPU")
    yield
    rt.set_context(device_target="CPU")


@pytest.mark.parametrize("func", ["seed_so", "cu_source"])
def test_seed_004_as_written(request, gpu_context, nvcc, func):
    path = request.getfixturevalue("seed_so") if func == "seed_so" else HERE / "cuda" / "seed004_custom_add.cu"
    t1 = Tensor([1., 2., 3.], rt.float32)
    t2 = Tensor([3., 2., 1.], rt.float32)
    assert t1.device == "GPU:0"
    custom_add = ops.Custom(f"{path}:CustomAdd", out_shape=[t1.shape[0]], out_dtype=rt.float32, func_type="aot")

    class Add(nn.Cell):
        def bprop(self, x, y, out, dout):
            return (y,)

        def construct(self, x, y):
            return custom_add(x, y)

    add = Add()
    res = add(t1, t2)
    res_g = rt.grad(add, grad_position=(0,))(t1, t2)
    assert res.device == "GPU:0" and res.asnumpy().tolist() == [4.0, 4.0, 4.0]
    assert res_g[0].device == "GPU:0" and res_g[0].asnumpy().tolist() == [3.0, 2.0, 1.0]


def test_a_cu_function_op_runs_on_device_and_gradchecks(cuda_ops):
    x = Tensor(np.linspace(-1, 1, 7), rt.float64, "GPU")
    y = cuda_ops.square_plus(x, 0.5)
    assert y.device == "GPU:0" and cuda_ops.device_of(x) == "cuda:0"
    np.testing.assert_allclose(y.asnumpy(), x.asnumpy() ** 2 + 0.5 * x.asnumpy())
    g = rt.grad(lambda a: cuda_ops.square_plus(a, 0.5).sum())(x)
    assert g.device == "GPU:0"
    # gradcheck in float64 through the device: CPU input -> GPU op -> CPU output (to() is differentiable)
    assert rt.gradcheck(lambda a: cuda_ops.square_plus(a.to("GPU"), 0.5).to("CPU"),
                        (Tensor(np.random.default_rng(0).normal(size=(3, 4)), rt.float64, requires_grad=True),))


def test_builtin_ops_and_an_mlp_give_the_cpus_gradients(gpu_context):
    rng = np.random.default_rng(1)
    x_np = rng.normal(size=(8, 5)).astype(np.float32)
    rt.set_seed(3)
    net_gpu = nn.SequentialCell([nn.Dense(5, 16), nn.Tanh(), nn.Dense(16, 3)])
    params = {n: p.asnumpy() for n, p in net_gpu.parameters_and_names()}
    rt.set_context(device_target="CPU")
    net_cpu = nn.SequentialCell([nn.Dense(5, 16), nn.Tanh(), nn.Dense(16, 3)])
    for n, p in net_cpu.parameters_and_names():
        p.set_data(params[n])

    def loss(net, x):
        return (nn.CrossEntropyLoss()(net(x), Tensor(np.array([0, 1, 2, 0, 1, 2, 0, 1]), device=x.device)) +
                (x.exp().sum() * 0.0))

    out_c, g_c = rt.value_and_grad(lambda x: loss(net_cpu, x), None, net_cpu.trainable_params())(Tensor(x_np))
    out_g, g_g = rt.value_and_grad(lambda x: loss(net_gpu, x), None, net_gpu.trainable_params())(
        Tensor(x_np, device="GPU"))
    assert all(g.device == "GPU:0" for g in g_g)
    np.testing.assert_allclose(float(out_g), float(out_c), rtol=1e-5)
    for a, b in zip(g_g, g_c):
        np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-4, atol=1e-6)


def test_mixing_devices_is_an_error_naming_both():
    with pytest.raises(rt.device.DeviceMismatchError, match=r"op 'add'.* on (CPU and on GPU:0|GPU:0 and on CPU)"):
        Tensor([1.0]) + Tensor([1.0], device="GPU")


def test_ops_launch_on_the_stream_made_current(cuda_ops, seed_so):
    s = rt.cuda.Stream(non_blocking=True)
    with rt.cuda.stream(s):
        assert rt.cuda.current_stream() == s and cuda_ops.stream() == s.ptr
        x = Tensor(np.ones(1 << 20), rt.float64, "GPU")
        y = cuda_ops.square_plus(x, 1.0)
        add = ops.Custom(f"{seed_so}:CustomAdd", out_shape=[4], out_dtype=rt.float32, func_type="aot")
        z = add(Tensor(np.ones(4, np.float32), device="GPU"), Tensor(np.ones(4, np.float32), device="GPU"))
    s.synchronize()
    assert float(y.asnumpy()[5]) == 2.0 and z.asnumpy().tolist() == [2.0] * 4


def test_dlpack_round_trips_share_memory_with_cupy_and_torch():
    import cupy as cp
    a = cp.arange(6, dtype=cp.float32)
    t = rt.from_dlpack(a)
    assert t.device == "GPU:0" and t._data.data.ptr == a.data.ptr
    b = cp.from_dlpack(t)
    assert b.data.ptr == a.data.ptr and t.__cuda_array_interface__["data"][0] == a.data.ptr
    torch = pytest.importorskip("torch")
    tt = torch.from_dlpack(t)
    assert tt.is_cuda and tt.data_ptr() == a.data.ptr
    back = rt.from_dlpack(tt)
    assert back._data.data.ptr == a.data.ptr


def test_cuda_error_from_a_function_op_is_a_runtime_error_and_the_next_op_runs(cuda_ops):
    with pytest.raises(RuntimeError, match=r"^CUDA error cudaErrorInvalidDevice"):
        cuda_ops.bad_launch()
    # the failed call was the thread's last CUDA error: OB_CUDA_CHECK cleared it, so the next op's
    # OB_CUDA_CHECK(cudaGetLastError()) does not raise it again
    y = cuda_ops.square_plus(Tensor([1.0, 2.0], rt.float64, "GPU"), 1.0)
    assert y.asnumpy().tolist() == [2.0, 6.0]


@pytest.mark.parametrize("make, labels", [
    (lambda: nn.CrossEntropyLoss(), [0, 1, 2, 3, 1, 2]),
    (lambda: nn.CrossEntropyLoss(weight=Tensor([1.0, 2.0, 3.0, 4.0], rt.float64), reduction="sum"),
     [0, 1, 2, 3, 1, -100]),
    (lambda: nn.CrossEntropyLoss(weight=np.array([1.0, 2.0, 3.0, 4.0]), label_smoothing=0.1), [0, 1, 2, 3, 1, 2]),
    (lambda: nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), [0, 1, 2, 3, 1, 2]),
])
def test_cross_entropy_with_class_labels_gives_the_cpus_loss_and_gradient(make, labels):
    x = np.random.default_rng(2).normal(size=(6, 4))

    def run(device):
        return rt.value_and_grad(lambda a: make()(a, Tensor(np.array(labels), device=device)), 0)(
            Tensor(x, rt.float64, device))
    (loss_c, g_c), (loss_g, g_g) = run("CPU"), run("GPU")
    assert loss_g.device == g_g.device == "GPU:0"
    np.testing.assert_allclose(float(loss_g), float(loss_c), rtol=1e-12)
    np.testing.assert_allclose(g_g.asnumpy(), g_c.asnumpy(), rtol=1e-12, atol=1e-15)
