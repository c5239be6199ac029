"""The seed's CUDA CustomAdd: a .cu aot source is built with nvcc (backend GPU).

Running it needs GPU tensors, which the runtime does not have yet (its tensors
are numpy arrays): the call is refused with a clear error instead of handing
host pointers to a CUDA kernel.
"""
from pathlib import Path

import pytest

import runtime as rt
from runtime import Tensor, ops

ROOT = Path(__file__).resolve().parents[1]
CU = ROOT / "custom_src" / "custom_add.cu"


def _cuda_toolkit_problem():
    """Why a GPU build cannot link here (None if it can): nvcc and, beside it, libcudart."""
    from opbuilder.toolchain import cuda_lib_dir, find_nvcc
    try:
        nvcc = find_nvcc(None)
    except FileNotFoundError:
        return "nvcc (the CUDA toolkit) is not installed"
    lib = cuda_lib_dir(nvcc)
    if lib is None or not (Path(lib) / "libcudart.so").exists():
        return (f"libcudart.so is not where the builder looks for it beside {nvcc.path} ({lib}); "
                f"set CUDA_HOME to the CUDA toolkit")
    return None


def test_a_cuda_source_is_built_with_nvcc_and_its_call_is_refused_on_host_tensors():
    problem = _cuda_toolkit_problem()
    if problem:
        pytest.skip(problem)
    op = ops.Custom(f"{CU}:CustomAdd", out_shape=[3], out_dtype=rt.float32, func_type="aot")
    assert op._kernel.backend == "GPU" and op._kernel.library.endswith(".so")
    with pytest.raises(RuntimeError, match="'CustomAdd' in .* was built for the GPU backend, but this runtime's "
                                           "tensors are numpy arrays in host memory"):
        op(Tensor([1.0, 2.0, 3.0]), Tensor([3.0, 2.0, 1.0]))
