"""runtime.cuda's and doctor's answers with the real CuPy installed on a machine that cannot use it.

These run where CuPy is installed (a scratch venv with cupy-cuda13x on a CPU machine, say) and skip,
saying why, elsewhere: they check what CuPy itself reports here (no driver, no NVRTC), not a stand-in.
"""
import importlib.util
import subprocess

import pytest

import runtime as rt

from builder_util import PYTHON, child_env

needs_cupy = pytest.mark.skipif(importlib.util.find_spec("cupy") is None, reason="CuPy is not installed here")


def _driver_version():
    import cupy
    try:
        return cupy.cuda.runtime.driverGetVersion()
    except Exception:
        return None


def _missing_nvrtc():
    """CuPy's own error loading NVRTC here, or None when it loads."""
    import cupy
    try:
        cupy.cuda.nvrtc.getVersion()
    except Exception as e:
        return str(e)
    return None


@needs_cupy
def test_without_a_driver_the_reason_is_no_driver_not_a_driver_too_old_for_cuda_0():
    if _driver_version() != 0:
        pytest.skip("an NVIDIA driver is installed here (CUDA reports its version)")
    assert rt.cuda.unavailable_reason() == "no NVIDIA driver is installed (the CUDA runtime found no libcuda)"
    assert rt.cuda.is_available() is False and rt.cuda.device_count() == 0
    with pytest.raises(ValueError, match=r"^device_target 'GPU' is not usable here: no NVIDIA driver is installed"):
        rt.set_context(device_target="GPU")
    assert rt.get_context("device_target") == "CPU"


@needs_cupy
def test_cupy_without_nvrtc_is_named_with_the_ctk_fix():
    if _missing_nvrtc() is None:
        pytest.skip("CuPy loads NVRTC here")
    import cupy

    from runtime.cuda import _library_problem
    major = cupy.cuda.runtime.runtimeGetVersion() // 1000
    why = _library_problem(cupy)
    assert why.startswith("CuPy cannot load the CUDA libraries its kernels need: NVRTC: ") and \
        why.endswith(f"; pip install 'cupy-cuda{major}x[ctk]', or install the CUDA {major} toolkit"), why
    assert "libnvrtc" in why


@needs_cupy
def test_doctor_says_cupy_cannot_load_nvrtc_and_how_to_get_it(tmp_path):
    if _missing_nvrtc() is None:
        pytest.skip("CuPy loads NVRTC here")
    import cupy
    major = cupy.cuda.runtime.runtimeGetVersion() // 1000
    res = subprocess.run([PYTHON, "-m", "opbuilder", "doctor"], capture_output=True, text=True, timeout=300,
                         env=child_env(OPBUILDER_CACHE_DIR=str(tmp_path / "cache")))
    lines = res.stdout.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith(("ok    CuPy: ", "error CuPy: ")))
    assert res.returncode == 1
    assert lines[i].startswith(f"error CuPy: {cupy.__version__} (CUDA runtime {major}.") and \
        " cannot load the CUDA libraries its kernels need: NVRTC: " in lines[i] and "libnvrtc" in lines[i]
    assert lines[i + 1].strip() == f"fix: pip install 'cupy-cuda{major}x[ctk]' (the wheel brings neither), or " \
                                   f"install the CUDA {major} toolkit"
