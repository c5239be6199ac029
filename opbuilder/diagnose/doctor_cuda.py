"""``doctor``'s GPU checks: nvcc and its host compiler, CuPy, the NVIDIA driver, and whether their CUDA
major versions fit together. CuPy is imported here only (and only when installed)."""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any, List, Optional, Tuple

from .doctor_check import Check

__all__ = ["cuda_checks", "cuda_mismatches", "driver_cuda_major", "cupy_library_problems"]

_TINY_CU = "#include <cuda_runtime.h>\n__global__ void opbuilder_probe(float *x) { x[0] = 1; }\n"
_TOO_NEW = re.compile(r"unsupported (GNU|clang|Microsoft Visual Studio) version!?[^\n]*")
# the oldest Linux driver whose CUDA major is this one (NVIDIA's compatibility table)
_DRIVER_MAJORS = ((580, 13), (525, 12), (450, 11))


def _major(version: Optional[str]) -> Optional[int]:
    m = re.match(r"(\d+)", version or "")
    return int(m.group(1)) if m else None


def driver_cuda_major(driver: Optional[str], cuda: Optional[str]) -> Optional[int]:
    """The newest CUDA major a driver runs: what nvidia-smi says, else from the driver's version."""
    if cuda:
        return _major(cuda)
    version = _major(driver)
    return next((cm for least, cm in _DRIVER_MAJORS if version is not None and version >= least), None)


def cuda_mismatches(nvcc: Optional[int], cupy: Optional[int], driver: Optional[int]) -> List[Check]:
    """Problems between the CUDA majors of nvcc, CuPy's runtime and the driver (None: absent)."""
    out = []
    if nvcc and cupy and nvcc != cupy:
        out.append(Check("CUDA versions", "error",
                         f"nvcc is CUDA {nvcc} but CuPy runs on the CUDA {cupy} runtime: a .cu operator and CuPy "
                         f"would each load their own CUDA runtime into one process",
                         f"pip install 'opbuilder[cuda{nvcc}]' (cupy-cuda{nvcc}x), or point NVCC or CUDA_HOME "
                         f"at a CUDA {cupy} toolkit"))
    for what, major in (("nvcc", nvcc), ("CuPy", cupy)):
        if driver and major and major > driver:
            out.append(Check("CUDA versions", "error",
                             f"{what} is CUDA {major} but the driver runs CUDA {driver} at most: code it builds or "
                             f"runs will not start on this GPU",
                             f"update the NVIDIA driver (CUDA 13 needs 580 or newer, CUDA 12 525), or use "
                             f"{f'a CUDA {driver} toolkit' if what == 'nvcc' else f'cupy-cuda{driver}x'}"))
    return out


def _nvcc() -> Tuple[List[Check], Optional[int]]:
    from ..tools.toolchain import find_nvcc, which

    try:
        nvcc = find_nvcc(None)
    except FileNotFoundError:
        return [Check("nvcc", "note", "not found (needed only for backend='GPU')",
                      "install the CUDA toolkit, or set CUDA_HOME or NVCC")], None
    m = re.search(r"release (\d+)\.(\d+)", nvcc.version)
    major = int(m.group(1)) if m else None
    checks = [Check("nvcc", "ok", f"{nvcc.path} ({nvcc.version}; CUDA {major if m else 'unknown'})")]
    argv = list(nvcc.argv)
    if "-ccbin" in argv[:-1]:
        host = argv[argv.index("-ccbin") + 1]
    elif os.environ.get("CUDAHOSTCXX"):
        from ..tools.toolchain import nvcc_host
        try:
            ccbin, _ = nvcc_host(nvcc, (), None)
        except FileNotFoundError as e:
            checks.append(Check("nvcc host compiler", "error", str(e),
                                "set CUDAHOSTCXX to a host compiler nvcc supports (g++-N), or unset it"))
            return checks, major
        argv += ccbin
        host = f"{ccbin[1]} (from CUDAHOSTCXX)"
    else:
        host = which("g++") or "g++ on PATH"
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "probe.cu").write_text(_TINY_CU)
        try:
            res = subprocess.run([*argv, "-c", "probe.cu", "-o", "probe.o"], cwd=d, capture_output=True,
                                 text=True, timeout=300, stdin=subprocess.DEVNULL)
            ok, out = res.returncode == 0, res.stdout + res.stderr
        except (OSError, subprocess.SubprocessError) as e:
            ok, out = False, str(e)
    if ok:
        checks += [Check("nvcc host compiler", "ok", f"{host} (nvcc compiles a .cu with it)"), _archs()]
        return checks, major
    too_new = _TOO_NEW.search(out)
    if too_new:
        checks.append(Check("nvcc host compiler", "error",
                            f"{host} is newer than nvcc {nvcc.version.split(',')[-1].strip()} supports: "
                            f"{too_new.group(0)[:160]}",
                            "give nvcc an older host compiler: CUDAHOSTCXX=g++-N (every build), or "
                            "cuda_cflags=['-ccbin', 'g++-N'] (one operator); or install a newer CUDA toolkit"))
    else:
        first = next((ln for ln in out.splitlines() if "error" in ln.lower()), out.strip()[:300])
        checks.append(Check("nvcc host compiler", "error", f"nvcc cannot compile a tiny .cu with {host}: {first}",
                            "check the CUDA toolkit install (python -m opbuilder build --verbose shows commands)"))
    return checks, major


def _archs() -> Check:
    from ..tools.cuda_arch import ACCEPTED, arch_flags

    try:
        flags, source = arch_flags([], None)
    except ValueError as e:
        return Check("GPU architectures", "error", str(e).split("; accepted")[0], f"use {ACCEPTED}")
    codes = [f.rsplit("code=", 1)[1].replace("compute_", "PTX ") for f in flags]
    return Check("GPU architectures", "ok", f"{', '.join(codes)} (from {source})")


def _cupy() -> Tuple[Check, Optional[int]]:
    import importlib.util

    if importlib.util.find_spec("cupy") is None:
        return Check("CuPy", "note", "not installed (only GPU tensors need it; builds do not)",
                     "pip install 'opbuilder[cuda13]' (cupy-cuda13x), or [cuda12] for a CUDA 12 driver"), None
    try:
        import cupy  # type: ignore
        runtime = int(cupy.cuda.runtime.runtimeGetVersion())
    except Exception as e:  # a broken or mismatched install raises anything
        return Check("CuPy", "error", f"installed but not usable: {type(e).__name__}: {str(e)[:200]}",
                     "reinstall the cupy-cudaXXx wheel matching your driver's CUDA major"), None
    major = runtime // 1000
    what = f"{cupy.__version__} (CUDA runtime {major}.{runtime % 1000 // 10})"
    missing = cupy_library_problems(cupy)
    if missing:
        return Check("CuPy", "error", f"{what} cannot load the CUDA libraries its kernels need: {'; '.join(missing)}",
                     f"pip install 'cupy-cuda{major}x[ctk]' (the wheel brings neither), or install the CUDA "
                     f"{major} toolkit"), major
    return Check("CuPy", "ok", what), major


def cupy_library_problems(cupy: Any) -> List[str]:
    """The CUDA libraries CuPy cannot load ("NVRTC: ..."): NVRTC compiles every kernel, cuBLAS does matmul.
    Needs no device: only the libraries are loaded (doctor, and runtime.cuda's probe)."""
    missing = []
    for name, load in (("NVRTC", lambda: cupy.cuda.nvrtc.getVersion()), ("cuBLAS", lambda: cupy.cuda.cublas)):
        try:
            load()
        except AttributeError:  # a CuPy without this entry point: nothing is known, nothing claimed
            continue
        except Exception as e:  # ImportError, or cuda.pathfinder's DynamicLibNotFoundError
            missing.append(f"{name}: {str(e).splitlines()[0].split(': ')[0][:120]}")
    return missing


def _driver() -> Tuple[Check, Optional[int]]:
    from ..tools.gpu_probe import driver_info

    driver, cuda, source = driver_info()
    if driver is None:
        return Check("NVIDIA driver", "note", f"no driver ({source}); builds work without one, running on a GPU "
                                               f"needs one"), None
    major = driver_cuda_major(driver, cuda)
    runs = f"runs CUDA {cuda or major or 'unknown'}"
    return Check("NVIDIA driver", "ok", f"{driver} ({runs}; from {source})"), major


def cuda_checks() -> List[Check]:
    """nvcc, its host compiler, CuPy, the driver, and the CUDA-major problems between them."""
    checks, nvcc = _nvcc()
    cupy, cupy_major = _cupy()
    driver, driver_major = _driver()
    return checks + [cupy, driver] + cuda_mismatches(nvcc, cupy_major, driver_major)
