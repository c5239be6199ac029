"""On a GPU (``python -m pytest -m gpu``): seed 004 as written, a .cu Function op gradient-checked on the
device, built-in ops and an MLP matching the CPU, streams, DLPack with CuPy and torch.

Skipped with the reason (no CuPy, no device, driver too old) where no GPU is usable.
"""
import subprocess
from pathlib import Path

import numpy as np
import pytest

import runtime as rt
from runtime import Tensor, mint, nn, ops

from builder_util import cuda_toolkit_problem
from op_util import load_op

HERE = Path(__file__).resolve().parent
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not rt.cuda.is_available(), reason=f"no usable GPU: {rt.cuda.unavailable_reason()}")]


@pytest.fixture(scope="session")
def nvcc():
    """nvcc's path; the tests that build CUDA code skip, saying why, on a GPU machine without the toolkit."""
    problem = cuda_toolkit_problem()
    if problem:
        pytest.skip(problem)
    from opbuilder.tools.toolchain import find_nvcc
    return find_nvcc(None).path


@pytest.fixture(scope="session")
def cuda_ops(cache_dir, nvcc):
    return load_op("cuda_function_ops", [HERE / "cuda" / "cuda_function_ops.cu"], backend="GPU")


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
    # a one-position tuple gives the gradient itself, as MindSpore does: the seed prints [3. 2. 1.]
    assert isinstance(res_g, Tensor) and res_g.device == "GPU:0" and res_g.asnumpy().tolist() == [3.0, 2.0, 1.0]


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
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")
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


# ---- every built-in op, layer, optimizer and checkpoint path on the device, against the CPU ----------------------
# (each of these failed under CuPy's rules before the fix it pins: numpy arrays made next to CuPy ones, numpy's
# writeable flag, np.add.at and a frompyfunc ufunc, which CuPy does not dispatch, and so on; see docs/reference/gpu.md)

def _outputs_and_grads(fn, arrays, device):
    """fn's tensor outputs and the gradient of a weighted sum of its float outputs w.r.t. each float input."""
    ts = [Tensor(a, None, device) if isinstance(a, np.ndarray) else a for a in arrays]
    outs = fn(*ts)
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    floats = tuple(i for i, a in enumerate(arrays) if isinstance(a, np.ndarray) and a.dtype.kind == "f")
    weights = [np.random.default_rng(5 + k).normal(size=o.shape) for k, o in enumerate(outs)]

    def loss(*xs):
        res = fn(*xs)
        res = list(res) if isinstance(res, (tuple, list)) else [res]
        return sum((r * Tensor(w, r.dtype, device)).sum() for r, w in zip(res, weights) if r.dtype == rt.float64)
    if floats and any(o.dtype == rt.float64 for o in outs):
        grads = rt.grad(loss, floats)(*ts)
        outs += list(grads) if isinstance(grads, tuple) else [grads]
    return outs


def _same_on_both(fn, *arrays, rtol=1e-12, atol=1e-14):
    cpu, gpu = _outputs_and_grads(fn, arrays, "CPU"), _outputs_and_grads(fn, arrays, "GPU")
    assert len(cpu) == len(gpu)
    for c, g in zip(cpu, gpu):
        assert g.device == "GPU:0" and g.dtype == c.dtype and g.shape == c.shape
        np.testing.assert_allclose(g.asnumpy(), c.asnumpy(), rtol=rtol, atol=atol)


_X = np.random.default_rng(3).normal(size=(3, 4))
_Y = np.random.default_rng(4).normal(size=(3, 4))


@pytest.mark.parametrize("fn, arrays", [
    (lambda x: ops.max(x, 1), (_X,)),                       # its rule made a numpy one-hot (np.zeros)
    (lambda x: ops.min(x, 0, True), (_X,)),
    (lambda x: ops.max(x), (_X,)),                          # argmax of the whole tensor went through np.asarray
    (lambda x: (ops.argmax(x), ops.argmin(x, 1, True)), (_X,)),
    (lambda x: ops.max(x, 0), (np.array(1.5),)),            # a 0-d input's index was a host array
    (lambda x: ops.clip(x, -0.5, 0.5), (_X,)),              # bounds were 0-d numpy arrays, which CuPy refuses
    (lambda x: ops.clip(x, 0, 2), (np.array([-1, 1, 3]),)),
    (lambda x: ops.gelu(x, "none"), (_X,)),                 # math.erf through np.frompyfunc
    (lambda x: ops.split(x, [1, 3], 1), (_X,)),             # the pieces' rule padded into np.zeros
    (lambda x, i: ops.gather(x, i, 1), (_X, np.array([2, 0, 3, 2]))),  # the rule's np.add.at
    (lambda x: ops.gather(x, [0, 2, 2], 0), (_X,)),         # host indices next to a GPU tensor
    (lambda i: ops.one_hot(i, 4, 2.0, -1.0, 0), (np.array([2, 0, 1, 2]),)),  # np.arange, 0-d on/off values
    (lambda x, y: mint.max(x, 1)[0].sum() * mint.min(y, 0, True)[0], (_X, _Y)),
])
def test_builtin_ops_give_the_cpus_values_and_gradients(fn, arrays):
    _same_on_both(fn, *arrays)


def test_printing_a_gpu_tensor_prints_what_the_cpu_prints(capsys):
    def printed(device):
        ops.print_(Tensor(_X, rt.float32, device), Tensor(0.7, rt.float32, device),
                   Tensor(np.array([[1], [1]]), rt.int32, device))
        return capsys.readouterr().out
    assert printed("GPU") == printed("CPU")


def test_writes_into_a_gpu_tensor_take_numbers_lists_numpy_arrays_and_gpu_tensors():
    def written(device):
        x = Tensor(np.zeros((3, 4)), rt.float64, device)
        x[0] = 1.0
        x[1, 1:3] = np.array([5.0, 6.0])    # CuPy's basic-index fill refuses a non-scalar numpy array
        x[2] = Tensor(np.arange(4.0), device=device)
        x[x > 5] = 9.0
        x[[1, 2], 3] = [7.0, 8.0]
        x += 1
        x /= np.full((3, 4), 2.0)
        ops.assign(x, ops.add(x, 1.0).detach())
        y = ops.assign(Tensor(np.zeros(4), rt.float64, device), 3.0)  # a number was broadcast as a numpy array
        return x, y
    (xc, yc), (xg, yg) = written("CPU"), written("GPU")
    assert xg.device == yg.device == "GPU:0"
    np.testing.assert_array_equal(xg.asnumpy(), xc.asnumpy())
    np.testing.assert_array_equal(yg.asnumpy(), yc.asnumpy())


def test_a_gpu_value_written_into_a_cpu_tensor_is_a_device_mismatch():
    x = Tensor(np.zeros(3))
    with pytest.raises(rt.device.DeviceMismatchError, match=r"Tensor.__setitem__: the value is on GPU:0 .* on CPU"):
        x[0:2] = Tensor(np.ones(2), device="GPU")
    with pytest.raises(rt.device.DeviceMismatchError, match=r"gather: input_indices is on GPU:0"):
        ops.gather(Tensor(_X), Tensor(np.array([0, 1]), device="GPU"), 0)


def test_a_gpu_integer_tensor_is_an_index_and_numpy_scalars_go_to_its_device():
    i = Tensor(np.array(2), device="GPU")
    assert [10, 20, 30][i] == 30  # CuPy arrays have no __index__
    with pytest.raises(TypeError, match="only integer scalar arrays"):
        [10, 20][Tensor(np.array([1]), device="GPU")]
    x = Tensor(_X, rt.float32, "GPU")
    for y, c in [(np.float64(2.0) * x, np.float64(2.0) * Tensor(_X, rt.float32)),
                 (x - np.float32(1.0), Tensor(_X, rt.float32) - np.float32(1.0))]:
        assert y.device == "GPU:0" and y.dtype == c.dtype
        np.testing.assert_array_equal(y.asnumpy(), c.asnumpy())


def test_dropout_initializers_and_mint_constructors_make_their_tensors_on_the_device(gpu_context):
    rt.set_seed(7)
    d = nn.Dropout(p=0.3).set_train(True)
    out_g = d(Tensor(_X, rt.float64))  # the mask was a host array multiplied into a GPU tensor
    rt.set_seed(7)
    out_c = d(Tensor(_X, rt.float64, "CPU"))
    assert out_g.device == "GPU:0"
    np.testing.assert_array_equal(out_g.asnumpy(), out_c.asnumpy())
    from runtime.nn.init import initializer
    assert initializer("normal", (2, 2)).device == "GPU:0"
    assert initializer(Tensor(_X, device="GPU"), (3, 4), rt.float64).device == "GPU:0"
    assert mint.zeros((2, 3)).device == mint.ones(3, dtype=rt.int32).device == "GPU:0"


@pytest.mark.parametrize("make", [
    lambda p: nn.SGD(p, 0.1, momentum=0.9, nesterov=True, weight_decay=0.01, loss_scale=4.0),
    lambda p: nn.SGD(p, [0.1, 0.05], momentum=0.5, dampening=0.2),
    lambda p: nn.Momentum(p, 0.1, 0.9, weight_decay=0.1, loss_scale=2.0),
    lambda p: nn.Adam(p, 0.01, weight_decay=0.01, loss_scale=8.0, use_nesterov=True),
    lambda p: nn.AdamWeightDecay(p, 0.01, weight_decay=0.1),
])
@pytest.mark.parametrize("dtype", [rt.float64, rt.float16])
def test_optimizers_step_gpu_parameters_as_on_the_cpu_and_checkpoint_their_state(tmp_path, make, dtype):
    # (every step read numpy's writeable flag, which CuPy's flags do not have; state came back as numpy)
    def trained(device, steps=3):
        w = rt.Parameter(Tensor(_X.copy(), dtype, device), name="w")
        b = rt.Parameter(Tensor(_Y[0].copy(), dtype, device), name="beta")
        opt = make([w, b])
        for k in range(steps):
            opt([Tensor(np.cos(_X * (k + 1)), dtype, device), Tensor(np.sin(_Y[0] * (k + 1)), dtype, device)])
        return opt
    cpu, gpu = trained("CPU"), trained("GPU")
    tol = dict(rtol=1e-12, atol=1e-14) if dtype == rt.float64 else dict(rtol=1e-3, atol=1e-3)
    for (n, c), (_, g) in zip(cpu.parameters_and_names(), gpu.parameters_and_names()):
        assert g.device == "GPU:0", n
        np.testing.assert_allclose(g.asnumpy().astype(np.float64), c.asnumpy().astype(np.float64), **tol)
    # saved from the GPU, resumed on the GPU and on the CPU: the next step is the one the run would take
    path = tmp_path / "opt.safetensors"
    rt.save_checkpoint(gpu, path)
    for device in ("GPU", "CPU"):
        resumed = make([rt.Parameter(Tensor(np.zeros_like(_X), dtype, device), name="w"),
                        rt.Parameter(Tensor(np.zeros_like(_Y[0]), dtype, device), name="beta")])
        rt.load_param_into_net(resumed, rt.load_checkpoint(path))
        grads = [np.cos(_X * 9), np.sin(_Y[0] * 9)]
        resumed([Tensor(g, dtype, device) for g in grads])
        ref = trained("CPU")
        ref([Tensor(g, dtype) for g in grads])
        for p, q in zip(resumed.parameters, ref.parameters):
            assert p.device == ("GPU:0" if device == "GPU" else "CPU")
            np.testing.assert_allclose(p.asnumpy().astype(np.float64), q.asnumpy().astype(np.float64), **tol)


def test_an_optimizer_refuses_gradients_from_another_device():
    w = rt.Parameter(Tensor(_X.copy(), rt.float64, "GPU"), name="w")
    with pytest.raises(rt.device.DeviceMismatchError,
                       match=r"SGD: the gradient for parameter 'w' is on CPU, the parameter on GPU:0"):
        nn.SGD([w], 0.1)([Tensor(_X)])
    nn.SGD([w], 0.1)([np.ones_like(_X)])  # host data (not a tensor) goes to the parameter's device
    np.testing.assert_allclose(w.asnumpy(), _X - 0.1)


def test_a_gpu_network_saves_and_loads_its_checkpoint(tmp_path, gpu_context):
    rt.set_seed(3)
    net = nn.SequentialCell([nn.Dense(4, 3), nn.Tanh()])
    rt.save_checkpoint(net, tmp_path / "m.safetensors")  # parameters copied to the host for the file
    loaded = rt.load_checkpoint(tmp_path / "m.safetensors")
    rt.set_seed(4)
    other = nn.SequentialCell([nn.Dense(4, 3), nn.Tanh()])
    rt.load_param_into_net(other, loaded)  # host arrays into GPU parameters (CuPy's copyto refuses them)
    for (n, p), (_, q) in zip(net.parameters_and_names(), other.parameters_and_names()):
        assert q.device == "GPU:0"
        np.testing.assert_array_equal(q.asnumpy(), p.asnumpy())


def test_backward_adds_into_a_gpu_grad_in_place_and_a_training_cell_resumes(tmp_path, gpu_context, cuda_ops):
    """.grad on the device takes a later gradient in place (CuPy's arrays have no writeable flag); a
    training cell's checkpoint holds its optimizer's state and resumes on the device."""
    w = Tensor(np.array([1.0, 2.0]), rt.float64, "GPU", requires_grad=True)
    cuda_ops.square_plus(w, 0.5).sum().backward()
    g = w.grad
    (w * 3.0).sum().backward()
    assert w.grad is g and g.device == "GPU:0"
    np.testing.assert_allclose(g.asnumpy(), 2 * w.asnumpy() + 0.5 + 3.0)
    x, y = Tensor(np.ones((4, 3), np.float32)), Tensor(np.zeros((4, 2), np.float32))

    def train(seed):
        rt.set_seed(seed)
        net = nn.Dense(3, 2)
        return nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.Adam(net.trainable_params(), 0.05))

    cell = train(0)
    cell(x, y)
    rt.save_checkpoint(cell, tmp_path / "train.safetensors")
    expected = [float(cell(x, y).asnumpy()) for _ in range(2)]
    fresh = train(1)
    assert rt.load_param_into_net(fresh, rt.load_checkpoint(tmp_path / "train.safetensors"),
                                  strict_load=True) == ([], [])
    assert fresh.network._backbone.weight.device == "GPU:0"
    np.testing.assert_allclose([float(fresh(x, y).asnumpy()) for _ in range(2)], expected, rtol=1e-5)


def test_gradcheck_takes_gpu_inputs():
    x = Tensor(_X, rt.float64, "GPU", requires_grad=True)
    assert rt.gradcheck(lambda a: ops.tanh(a) * ops.gelu(a, "none"), (x,))
    with pytest.raises(rt.GradcheckError):
        rt.gradcheck(_wrong_square, (x,))


def _wrong_square(a):
    class Square(rt.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            x, = ctx.saved_tensors
            return g * x  # should be 2 * g * x
    return Square.apply(a)


@pytest.mark.parametrize("level", ["O0", pytest.param("O1", marks=pytest.mark.build)])  # O1 compiles (CPU)
def test_jit_traces_gpu_inputs_apart_from_cpu_ones(level):
    # the signature keyed every tensor as on the CPU: a graph traced on the CPU (with CPU constants) ran for
    # GPU inputs; O1's fused kernels are host code, so a GPU signature runs at O0
    f = rt.jit(lambda x, y: ops.tanh(x * y + 1.0) * 2.0, jit_level=level)
    res = {}
    for device in ("CPU", "GPU"):
        x, y = Tensor(_X, rt.float64, device), Tensor(_Y, rt.float64, device)
        res[device] = [f(x, y)] + list(rt.value_and_grad(lambda a, b: f(a, b).sum(), (0, 1))(x, y)[1])
    assert f.traces == 2
    for c, g in zip(res["CPU"], res["GPU"]):
        assert g.device == "GPU:0"
        np.testing.assert_allclose(g.asnumpy(), c.asnumpy(), rtol=1e-12)


# ---- other frameworks' device arrays into a .cu operator (issue 23's CuPy part) ----------------------

def test_cupy_arrays_reach_a_cu_op_as_device_pointers_without_a_copy(cuda_ops):
    import cupy as cp
    a = cp.linspace(-1, 1, 9, dtype=cp.float64)
    assert cuda_ops.data_ptr(a) == a.data.ptr
    y = cuda_ops.square_plus(a, 0.5)
    assert isinstance(y, Tensor) and y.device == "GPU:0"
    np.testing.assert_allclose(y.asnumpy(), cp.asnumpy(a * a + 0.5 * a))


def test_cupy_arrays_run_on_the_current_stream(cuda_ops):
    import cupy as cp
    s = rt.cuda.Stream(non_blocking=True)
    with rt.cuda.stream(s):
        a = cp.full(1 << 20, 2.0, dtype=cp.float64)
        assert cuda_ops.stream() == s.ptr
        y = cuda_ops.square_plus(a, 1.0)
    s.synchronize()
    assert float(y.asnumpy()[-1]) == 6.0


def test_a_strided_cupy_view_reaches_a_function_op_as_a_contiguous_copy_as_on_the_host(cuda_ops):
    import cupy as cp
    a = cp.arange(8, dtype=cp.float64)[::2]
    y = cuda_ops.square_plus(a, 1.0)
    assert y.asnumpy().tolist() == [0.0, 6.0, 20.0, 42.0]


def test_torch_cuda_tensors_reach_a_cu_op_and_to_torch_gradchecks_on_the_device(cuda_ops):
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")
    if not torch.cuda.is_available():
        pytest.skip(f"torch {torch.__version__} sees no GPU")
    import opbuilder
    x = torch.linspace(-1, 1, 7, dtype=torch.float64, device="cuda")
    assert cuda_ops.data_ptr(x) == x.data_ptr()
    ops_t = opbuilder.to_torch(cuda_ops, backend="GPU")
    y = ops_t.square_plus(x, 0.5)
    assert isinstance(y, torch.Tensor) and y.is_cuda
    torch.testing.assert_close(y, x * x + 0.5 * x)
    xg = torch.randn(3, 4, dtype=torch.float64, device="cuda", requires_grad=True)
    assert torch.autograd.gradcheck(lambda a: ops_t.square_plus(a, 0.5), (xg,))


def test_torch_cuda_tensors_through_the_bridge_use_torchs_allocator_and_stream(cuda_ops, torch_bridge, monkeypatch):
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")
    if not torch.cuda.is_available():
        pytest.skip(f"torch {torch.__version__} sees no GPU")
    import opbuilder
    monkeypatch.setenv("OPBUILDER_TORCH_BRIDGE", "1")
    ops_t = opbuilder.to_torch(cuda_ops, backend="GPU")
    x = torch.linspace(-1, 1, 1 << 20, dtype=torch.float64, device="cuda")
    ops_t.square_plus(x, 0.5)  # each signature's first call registers its operator (the Python path)
    ops_t.stream_tensor(x)
    op = ops_t.square_plus.bridged[0]
    before = op.fast_calls
    torch.cuda.synchronize()
    used = torch.cuda.memory_allocated()
    y = ops_t.square_plus(x, 0.5)
    assert op.fast_calls == before + 1
    assert y.is_cuda and torch.cuda.memory_allocated() >= used + x.numel() * 8  # torch's allocator made it
    torch.testing.assert_close(y, x * x + 0.5 * x)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        assert ops_t.stream_tensor(x).item() == s.cuda_stream  # Forward launches on torch's current stream
        z = ops_t.square_plus(x, 1.0)
    s.synchronize()
    torch.testing.assert_close(z, x * x + x)
    xg = torch.randn(3, 4, dtype=torch.float64, device="cuda", requires_grad=True)
    assert torch.autograd.gradcheck(lambda a: ops_t.square_plus(a, 0.5), (xg,))
    assert op.fast_calls > before + 3
    with pytest.raises(ValueError, match=r"^square_plus: argument 0 is a cuda tensor; this operator runs on cpu "
                                         r"tensors \(move it with \.to\('cpu'\)\)$"):
        opbuilder.to_torch(cuda_ops).square_plus(x, 0.5)  # a CPU module: CUDA tensors are refused, as before
