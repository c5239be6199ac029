"""aot operators that call other libraries: OpenBLAS gemm (scipy-openblas32) and PyTorch ATen."""
import os
from pathlib import Path

import numpy as np
import pytest

import runtime as rt
from opbuilder import build_library
from runtime import Tensor, nn, ops
from runtime.ops import CustomRegOp

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gemm_lib(cache_dir):
    import scipy_openblas32 as blas  # in the test extra: pip install -e ".[test]"
    lib_dir = blas.get_lib_dir()
    return build_library("aot_gemm", [ROOT / "custom_src" / "aot_gemm.cpp"], include_paths=[blas.get_include_dir()],
                         ldflags=[f"-L{lib_dir}", f"-l{blas.get_library()}", f"-Wl,-rpath,{lib_dir}"])


def matmul_op(lib, transpose_a=False, transpose_b=False, bprop=None):
    def out_shape(a, b):
        return [a[1] if transpose_a else a[0], b[0] if transpose_b else b[1]]

    info = (CustomRegOp("matmul").input(0, "a").input(1, "b").output(0, "y")
            .attr("transpose_a", "required", "bool", value=transpose_a)
            .attr("transpose_b", "required", "bool", value=transpose_b).get_op_info())
    return ops.Custom(f"{lib}:MatMul", out_shape=out_shape, out_dtype=lambda a, b: a, bprop=bprop, reg_info=info)


def test_openblas_gemm_matches_numpy(gemm_lib):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((5, 3)).astype(np.float32)
    b = rng.standard_normal((3, 4)).astype(np.float32)
    out = matmul_op(gemm_lib)(Tensor(a), Tensor(b))
    assert out.dtype == rt.float32 and out.shape == (5, 4)
    np.testing.assert_allclose(out.asnumpy(), a @ b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(matmul_op(gemm_lib, transpose_a=True)(Tensor(a.T.copy()), Tensor(b)).asnumpy(),
                               a @ b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(matmul_op(gemm_lib, transpose_b=True)(Tensor(a), rt.from_numpy(b.T)).asnumpy(),
                               a @ b, rtol=1e-5, atol=1e-6)  # b.T is a view: made contiguous first
    np.testing.assert_array_equal(matmul_op(gemm_lib)(Tensor(np.zeros((2, 0))), Tensor(np.zeros((0, 3)))).asnumpy(),
                                  np.zeros((2, 3)))


def test_openblas_gemm_rejects_shapes_that_do_not_multiply(gemm_lib):
    with pytest.raises(RuntimeError, match="'MatMul' in .* returned status 3"):
        matmul_op(gemm_lib)(Tensor(np.ones((2, 3))), Tensor(np.ones((2, 3))))


def test_openblas_gemm_gradients_with_a_bprop_of_gemms(gemm_lib):
    da_op = matmul_op(gemm_lib, transpose_b=True)  # dout @ b^T
    db_op = matmul_op(gemm_lib, transpose_a=True)  # a^T @ dout
    mm = matmul_op(gemm_lib, bprop=lambda a, b, out, dout: (da_op(dout, b), db_op(a, dout)))

    class Linear(nn.Cell):
        def __init__(self):
            super().__init__()
            self.w = rt.Parameter(np.random.default_rng(1).standard_normal((3, 2)))

        def construct(self, x):
            return mm(x, self.w).tanh()

    rng = np.random.default_rng(2)
    assert rt.gradcheck(mm, [Tensor(rng.standard_normal((4, 3))), Tensor(rng.standard_normal((3, 2)))])
    net = Linear()
    x = Tensor(rng.standard_normal((4, 3)))
    g = rt.grad(lambda t: net(t).sum())(x)
    w = net.w.asnumpy()
    np.testing.assert_allclose(g.asnumpy(), (1 - np.tanh(x.asnumpy() @ w) ** 2) @ w.T, rtol=1e-10)


@pytest.fixture(scope="module")
def torch_leaky_relu_lib(cache_dir):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch==2.13.0)")
    base = os.path.dirname(torch.__file__)
    lib_dir = os.path.join(base, "lib")
    return build_library("aot_torch_leaky_relu", [ROOT / "custom_src" / "aot_torch_leaky_relu.cpp"],
                         cflags=["-isystem", os.path.join(base, "include")],
                         ldflags=[f"-L{lib_dir}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{lib_dir}"])


class TorchLeakyReluNet(nn.Cell):
    def __init__(self, lib):
        super().__init__()
        self.leaky_relu = ops.Custom(f"{lib}:LeakyRelu", out_shape=lambda x: x, out_dtype=lambda x: x, func_type="aot")

    def construct(self, x):
        return self.leaky_relu(x)


def test_seed_aten_leaky_relu_out(torch_leaky_relu_lib):
    x0 = np.array([[0.0, -0.1], [-0.2, 1.0]]).astype(np.float32)
    net = TorchLeakyReluNet(torch_leaky_relu_lib)
    np.testing.assert_allclose(net(Tensor(x0)).asnumpy(), [[0.0, -0.001], [-0.002, 1.0]], rtol=1e-6)
    x = np.random.default_rng(0).standard_normal((3, 5))  # float64 too, and a non-contiguous view
    np.testing.assert_allclose(net(rt.from_numpy(x.T)).asnumpy(), np.where(x.T > 0, x.T, 0.01 * x.T))
    with pytest.raises(RuntimeError, match="'LeakyRelu' in .* returned status 3"):
        net(Tensor(np.array([1, -2], np.int32)))  # ATen has no integer leaky_relu: its exception becomes a status
