"""The seed's CUDA CustomAdd: a .cu aot source is built with nvcc (backend GPU).

Called on host tensors, the call is refused with a clear error instead of
handing host pointers to a CUDA kernel (tests/test_gpu_*.py run it on a GPU).
"""
from pathlib import Path

import pytest

import runtime as rt
from runtime import Tensor, ops

from builder_util import cuda_toolkit_problem

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)

ROOT = Path(__file__).resolve().parents[1]
CU = ROOT / "custom_src" / "custom_add.cu"


def test_a_cuda_source_is_built_with_nvcc_and_its_call_is_refused_on_host_tensors():
    problem = cuda_toolkit_problem()
    if problem:
        pytest.skip(problem)
    op = ops.Custom(f"{CU}:CustomAdd", out_shape=[3], out_dtype=rt.float32, func_type="aot")
    assert op._kernel.backend == "GPU" and op._kernel.library.endswith(".so")
    assert op._kernel.cuda == "built from a .cu source by nvcc"
    with pytest.raises(RuntimeError, match=r"^aot operator 'CustomAdd' in .*\.so is CUDA code \(built from a \.cu "
                                           r"source by nvcc\) and needs tensors on a GPU device, but input\(s\) "
                                           r"\[0, 1\] are on the CPU \(host memory\): its kernel would be handed "
                                           r"host pointers"):
        op(Tensor([1.0, 2.0, 3.0]), Tensor([3.0, 2.0, 1.0]))
