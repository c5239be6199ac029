"""CUDA sources build with nvcc on a machine without a GPU: a .cu Function op (opbuilder/cuda.h's
CurrentStream and OB_CUDA_CHECK) builds and imports, and what it can do without a device is checked."""
from pathlib import Path

import pytest

import runtime as rt
from runtime import Tensor

from builder_util import cuda_toolkit_problem
from op_util import load_op

CU = Path(__file__).resolve().parent / "cuda" / "cuda_function_ops.cu"


@pytest.fixture(scope="session")
def cuda_ops(cache_dir):
    problem = cuda_toolkit_problem()
    if problem:
        pytest.skip(problem)
    # -O0 for the host code (nvcc warns that it redefines the builder's -O2, and uses it): the host compile of
    # pybind11 and opbuilder's headers is about half of the build, and -O0 takes ~45% off it; device code
    # keeps ptxas's default -O3. One architecture and two one-line kernels already; cudafe++ and cicc parse the
    # headers for the device side (most of the rest), at any -O
    return load_op("cuda_function_ops", [CU], backend="GPU", cflags=["-Xcompiler", "-Wall,-Wextra"],
                   cuda_cflags=["-O0"])


def test_a_cu_function_op_builds_with_nvcc_and_imports(cuda_ops):
    assert callable(cuda_ops.square_plus) and cuda_ops.device_of(Tensor([1.0])) == "cpu"


def test_a_cuda_function_op_given_a_host_tensor_is_its_own_clear_error(cuda_ops):
    with pytest.raises(ValueError, match=r"^x must be a GPU tensor, got one on cpu$"):
        cuda_ops.square_plus(Tensor([1.0, 2.0], rt.float64), 2.0)


@pytest.mark.skipif(rt.cuda.is_available(), reason="a GPU is usable here")
def test_current_stream_without_a_gpu_is_a_value_error_saying_why(cuda_ops):
    with pytest.raises(ValueError, match=r"^no usable GPU: "):
        cuda_ops.stream()


def test_ob_cuda_check_turns_a_cuda_error_into_a_runtime_error(cuda_ops):
    with pytest.raises(RuntimeError, match=r"^CUDA error cuda\w+: .* \(cudaSetDevice\(-1\) at .*cuda_function_ops\.cu:\d+\)$"):
        cuda_ops.bad_launch()


@pytest.mark.build
def test_cudahostcxx_is_nvccs_host_compiler_and_part_of_the_key(tmp_path, monkeypatch):
    """CMake's CUDAHOSTCXX picks the compiler nvcc hands host code to (-ccbin); it is in the key, so
    moving to another host compiler rebuilds the .cu sources, and moving back finds the first build."""
    problem = cuda_toolkit_problem()
    if problem:
        pytest.skip(problem)
    import ctypes
    import time

    from builder_util import REAL_CXX
    from opbuilder import build_library
    from opbuilder.tools.probe_cache import SETTLE_NS

    src = tmp_path / "host.cu"
    src.write_text('extern "C" int host_answer() { return 41 + 1; }\n')
    log = tmp_path / "host.log"
    host = tmp_path / "host-g++"
    host.write_text(f"#!/bin/sh\necho \"$@\" >> '{log}'\nexec '{REAL_CXX}' \"$@\"\n")
    host.chmod(0o755)
    time.sleep(SETTLE_NS / 1e9 + 0.05)  # a compiler written this instant is probed again each time
    cache = tmp_path / "cache"
    monkeypatch.delenv("CUDAHOSTCXX", raising=False)
    default = Path(build_library("hosted", [src], backend="GPU", build_dir=cache))
    assert not log.exists()
    monkeypatch.setenv("CUDAHOSTCXX", str(host))
    hosted = Path(build_library("hosted", [src], backend="GPU", build_dir=cache))
    assert hosted != default and log.read_text().strip()  # a new key, and nvcc ran our host compiler
    assert f"-ccbin {host}" in (cache / "hosted.lib" / "build" / "build.ninja").read_text()
    assert ctypes.CDLL(str(hosted)).host_answer() == 42
    log.unlink()
    monkeypatch.delenv("CUDAHOSTCXX")
    assert Path(build_library("hosted", [src], backend="GPU", build_dir=cache)) == default and not log.exists()
    monkeypatch.setenv("CUDAHOSTCXX", str(tmp_path / "no-such-g++"))
    with pytest.raises(FileNotFoundError, match=r"CUDAHOSTCXX compiler '.*no-such-g\+\+' was not found on PATH"):
        build_library("hosted", [src], backend="GPU", build_dir=cache)
