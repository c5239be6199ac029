"""Finding the tools a build uses, kept apart from building.

The compiler comes from ``CXX`` (default ``c++``); its identity (resolved
path and ``--version`` line) is probed once and remembered in the cache
directory, keyed by the binary's size, mtime and inode, so the warm path
runs no process. ninja comes from the installed ``ninja`` package.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import List, Optional, Tuple

__all__ = ["Compiler", "find_compiler", "find_nvcc", "ninja_path", "python_include", "pybind11_info",
           "ext_suffix", "default_jobs"]


@dataclass(frozen=True)
class Compiler:
    """A resolved compiler command: argv prefix plus an identity string for cache keys."""

    argv: Tuple[str, ...]
    path: str
    identity: str


def _resolve(cmd: str, what: str) -> Tuple[Tuple[str, ...], str]:
    argv = tuple(shlex.split(cmd))
    if not argv:
        raise FileNotFoundError(f"{what} is empty")
    exe = shutil.which(argv[0])
    if exe is None:
        raise FileNotFoundError(f"{what} compiler '{argv[0]}' was not found on PATH; "
                                f"install g++ (or clang++) or set {what} to the compiler's path")
    real = os.path.realpath(exe)
    return (exe,) + argv[1:], real


def _probe_version(argv: Tuple[str, ...]) -> str:
    try:
        out = subprocess.run(list(argv) + ["--version"], capture_output=True, text=True, timeout=60)
    except OSError as e:
        raise FileNotFoundError(f"could not run {argv[0]}: {e}") from None
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else "unknown"


def _identity(argv: Tuple[str, ...], real: str, state_dir: Optional[Path]) -> str:
    """'<resolved path> <version line>', probed at most once per binary."""
    st = os.stat(real)
    stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
    key = " ".join(argv[1:] + (real,))
    cache_file = state_dir / "toolchains.json" if state_dir is not None else None
    cached = {}
    if cache_file is not None:
        try:
            cached = json.loads(cache_file.read_text())
        except (OSError, ValueError):
            cached = {}
        hit = cached.get(key)
        if hit and hit.get("stamp") == stamp:
            return hit["identity"]
    identity = f"{key} {_probe_version(argv)}"
    if cache_file is not None:
        cached[key] = {"stamp": stamp, "identity": identity}
        tmp = cache_file.with_name(f".toolchains.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(cached, indent=1))
            os.replace(tmp, cache_file)
        except OSError:
            pass
    return identity


def find_compiler(state_dir: Optional[Path]) -> Compiler:
    """The C++ compiler: ``$CXX``, else c++, g++ or clang++ from PATH."""
    env = os.environ.get("CXX")
    if env:
        argv, real = _resolve(env, "CXX")
    else:
        for cand in ("c++", "g++", "clang++"):
            if shutil.which(cand):
                argv, real = _resolve(cand, "CXX")
                break
        else:
            raise FileNotFoundError("no C++ compiler found (tried c++, g++, clang++); install g++ or set CXX")
    return Compiler(argv, real, _identity(argv, real, state_dir))


def find_nvcc(state_dir: Optional[Path]) -> Compiler:
    """nvcc for the GPU backend: ``$NVCC``, ``$CUDA_HOME/bin/nvcc``, or PATH."""
    env = os.environ.get("NVCC")
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    cand = env or (str(Path(cuda_home) / "bin" / "nvcc") if cuda_home else "nvcc")
    try:
        argv, real = _resolve(cand, "NVCC")
    except FileNotFoundError:
        raise FileNotFoundError("backend='GPU' needs nvcc: install the CUDA toolkit, or set CUDA_HOME "
                                "or NVCC") from None
    return Compiler(argv, real, _identity(argv, real, state_dir))


def cuda_lib_dir(nvcc: Compiler) -> Optional[str]:
    root = Path(nvcc.path).resolve().parent.parent
    for sub in ("lib64", "lib", "targets/x86_64-linux/lib"):
        if (root / sub / "libcudart.so").exists() or (root / sub).is_dir():
            return str(root / sub)
    return None


def ninja_path() -> str:
    """The ninja binary of the installed ``ninja`` package (not whatever PATH has)."""
    try:
        import ninja  # type: ignore
    except ImportError:
        raise FileNotFoundError("the 'ninja' Python package is missing: python -m pip install ninja") from None
    exe = Path(ninja.BIN_DIR) / ("ninja.exe" if os.name == "nt" else "ninja")
    if not exe.exists():
        raise FileNotFoundError(f"the ninja package has no binary at {exe}; reinstall it")
    return str(exe)


@lru_cache(maxsize=None)
def python_include() -> str:
    return sysconfig.get_paths()["include"]


@lru_cache(maxsize=None)
def pybind11_info() -> Tuple[str, str]:
    """(version, include dir) of the installed pybind11."""
    import pybind11
    return pybind11.__version__, pybind11.get_include()


@lru_cache(maxsize=None)
def ext_suffix() -> str:
    return sysconfig.get_config_var("EXT_SUFFIX") or ".so"


def python_abi() -> str:
    return f"{sys.implementation.cache_tag} {ext_suffix()}"


def default_jobs() -> int:
    """``MAX_JOBS`` if set, else cores, bounded by free memory (~1 GiB per compile)."""
    env = os.environ.get("MAX_JOBS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise ValueError(f"MAX_JOBS must be a positive integer, got {env!r}") from None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    avail = _available_memory()
    if avail is not None:
        cores = min(cores, max(1, avail // (1 << 30)))
    return max(1, cores)


def _available_memory() -> Optional[int]:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def split_flags(flags: Optional[List[str]]) -> List[str]:
    return list(flags or [])
