"""doctor's GPU lines: nvcc and its host compiler, the architectures builds target, CuPy, the driver,
and CUDA-major mismatches between them."""
import importlib.util
import os
import subprocess
import time

import pytest

from builder_util import PYTHON, REAL_CXX, child_env
from opbuilder.diagnose.doctor_cuda import cuda_mismatches, driver_cuda_major
from opbuilder.tools.probe_cache import SETTLE_NS
from opbuilder.tools.toolchain import which


def _doctor(tmp_path, **env):
    env.setdefault("OPBUILDER_CACHE_DIR", str(tmp_path / "cache"))
    res = subprocess.run([PYTHON, "-m", "opbuilder", "doctor"], capture_output=True, text=True, timeout=300,
                         env=child_env(**env))
    return res.returncode, res.stdout.splitlines()


def _line(lines, prefix):
    i = next(i for i, line in enumerate(lines) if line.startswith(prefix))
    return lines[i], (lines[i + 1].strip() if i + 1 < len(lines) else "")


@pytest.fixture
def nvcc():
    from opbuilder.tools.toolchain import find_nvcc
    try:
        return find_nvcc(None)
    except FileNotFoundError:
        pytest.skip("nvcc (the CUDA toolkit) is not installed")


def test_doctor_on_a_machine_with_nvcc_and_neither_cupy_nor_a_driver(tmp_path, nvcc, monkeypatch):
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here")
    if which("nvidia-smi") or os.path.exists("/proc/driver/nvidia/version"):
        pytest.skip("an NVIDIA driver is installed here")
    for var in ("OPBUILDER_CUDA_ARCH_LIST", "TORCH_CUDA_ARCH_LIST"):
        monkeypatch.delenv(var, raising=False)
    code, lines = _doctor(tmp_path)
    assert code == 0, lines
    major = nvcc.version.split("release ")[1].split(".")[0]
    assert _line(lines, "ok    nvcc: ")[0] == f"ok    nvcc: {nvcc.path} ({nvcc.version}; CUDA {major})"
    assert _line(lines, "ok    nvcc host compiler: ")[0].endswith(" (nvcc compiles a .cu with it)")
    assert _line(lines, "ok    GPU architectures: ")[0] == \
        "ok    GPU architectures: sm_80, PTX 80 (from the default: no GPU visible)"
    assert _line(lines, "note  CuPy: ") == ("note  CuPy: not installed (only GPU tensors need it; builds do not)",
                                            "fix: pip install 'opbuilder[cuda13]' (cupy-cuda13x), or [cuda12] "
                                            "for a CUDA 12 driver")
    assert "note  NVIDIA driver: no driver (nvidia-smi not found); builds work without one, running on a GPU " \
           "needs one" in lines
    assert not any(line.startswith("error CUDA versions") for line in lines)


def test_doctor_names_a_host_compiler_too_new_for_nvcc_and_the_fix(tmp_path, nvcc):
    """The real compiler, claiming to be gcc 99: nvcc's own header refuses it, as it refuses a new gcc."""
    host = tmp_path / "g++"
    host.write_text(f"#!/bin/sh\nexec '{REAL_CXX}' -D__GNUC__=99 \"$@\"\n")
    host.chmod(0o755)
    time.sleep(SETTLE_NS / 1e9 + 0.05)
    code, lines = _doctor(tmp_path, NVCC=f"{nvcc.path} -ccbin {host}")
    assert code == 1
    line, fix = _line(lines, "error nvcc host compiler: ")
    assert line.startswith(f"error nvcc host compiler: {host} is newer than nvcc ") and \
        "unsupported GNU version" in line
    assert fix == "fix: give nvcc an older host compiler: CUDAHOSTCXX=g++-N (every build), or " \
                  "cuda_cflags=['-ccbin', 'g++-N'] (one operator); or install a newer CUDA toolkit"
    assert not any(line.startswith("ok    GPU architectures") for line in lines)
    # the same compiler named by CUDAHOSTCXX (CMake's variable) is the one doctor tries
    code, lines = _doctor(tmp_path, CUDAHOSTCXX=str(host))
    assert code == 1
    line, _ = _line(lines, "error nvcc host compiler: ")
    assert line.startswith(f"error nvcc host compiler: {host} (from CUDAHOSTCXX) is newer than nvcc "), line
    code, lines = _doctor(tmp_path, CUDAHOSTCXX=REAL_CXX)
    assert _line(lines, "ok    nvcc host compiler: ")[0] == \
        f"ok    nvcc host compiler: {REAL_CXX} (from CUDAHOSTCXX) (nvcc compiles a .cu with it)"


def test_a_malformed_arch_list_is_a_doctor_error(tmp_path, nvcc):
    code, lines = _doctor(tmp_path, OPBUILDER_CUDA_ARCH_LIST="8.6;sm_9x")
    assert code == 1
    line, fix = _line(lines, "error GPU architectures: ")
    assert line == "error GPU architectures: OPBUILDER_CUDA_ARCH_LIST: 'sm_9x' is not an architecture"
    assert fix.startswith("fix: use compute capabilities separated by ';', ',' or spaces")


@pytest.mark.parametrize("driver, cuda, major", [("580.65.06", None, 13), ("550.54.15", None, 12),
                                                  ("550.54.15", "12.4", 12), ("470.1", None, 11),
                                                  ("390.1", None, None), (None, None, None)])
def test_the_cuda_major_a_driver_runs(driver, cuda, major):
    assert driver_cuda_major(driver, cuda) == major


def test_cuda_major_mismatches_are_errors_with_a_fix():
    assert cuda_mismatches(13, 13, 13) == [] and cuda_mismatches(13, None, None) == []
    (c,) = cuda_mismatches(13, 12, 13)
    assert (c.status, c.what) == ("error", "CUDA versions") and c.detail.startswith(
        "nvcc is CUDA 13 but CuPy runs on the CUDA 12 runtime")
    assert c.fix.startswith("pip install 'opbuilder[cuda13]' (cupy-cuda13x), or point NVCC or CUDA_HOME at a CUDA 12")
    old = cuda_mismatches(13, 13, 12)
    assert [c.detail.split(" but")[0] for c in old] == ["nvcc is CUDA 13", "CuPy is CUDA 13"]
    assert all("the driver runs CUDA 12 at most" in c.detail and c.fix.startswith("update the NVIDIA driver")
               for c in old)
    assert old[0].fix.endswith("or use a CUDA 12 toolkit") and old[1].fix.endswith("or use cupy-cuda12x")
