"""The C++ bridge to PyTorch: to_torch's fast path, built once per torch build, in the background.

A Python ``torch.autograd.Function`` costs more than a small C++ operator itself (benchmarks/interop.py's
floor row). So to_torch's eager calls go through ``_opbuilder_torch_bridge`` (include/opbuilder/torch_bridge.cpp),
a module compiled against libtorch: torch tensors reach the operator as views of their memory, results
come back as torch tensors over the memory the kernel wrote, and a C++ ``Function``'s node is a C++
``torch::autograd::Node`` whose backward calls ``Backward`` without Python in between.

Compiling against torch's headers takes ~15 s, once per torch build, compiler and opbuilder version (the
result is cached under the cache root's ``_obtorch``). ``to_torch`` never waits for it: the first call
starts the build on a thread, and calls take the Python path (same results) until the bridge is loaded.
``OPBUILDER_TORCH_BRIDGE=0`` keeps every call on the Python path; ``ready(wait=True)`` waits for it.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from types import ModuleType
from typing import List, Optional

from .cache_dir import cache_root
from .fingerprint import digest_of
from .headers import include_dir
from .lock import build_lock
from .toolchain import ext_suffix, find_compiler, python_abi

__all__ = ["ready", "status", "enabled", "ENV"]

ENV = "OPBUILDER_TORCH_BRIDGE"  # "0": to_torch stays on its Python path
MODULE = "_opbuilder_torch_bridge"
_lock = threading.Lock()
_module: Optional[ModuleType] = None
_error: Optional[str] = None
_thread: Optional[threading.Thread] = None
_started = threading.Event()  # the build's compiler is running, or there is nothing to compile


def enabled() -> bool:
    """Whether to_torch may use the bridge (``OPBUILDER_TORCH_BRIDGE`` is not ``0``)."""
    return os.environ.get(ENV, "1") != "0"


def ready(wait: bool = False, until_started: bool = False) -> Optional[ModuleType]:
    """The loaded bridge, or None while it builds (or when it is off or failed: ``status()`` says why).
    The first call starts the build; ``wait=True`` waits for it, ``until_started=True`` only until
    its compiler runs (a test session starts it so before its first test, on an idle core)."""
    global _thread
    if _module is not None or _error is not None:
        return _module
    if not enabled():
        return None
    with _lock:
        if _thread is None:
            _thread = threading.Thread(target=_build_and_load, name="opbuilder-torch-bridge", daemon=True)
            _thread.start()
        thread = _thread
    if wait:
        thread.join()
    elif until_started:
        _started.wait()
    return _module


def status() -> str:
    """What the bridge is doing, in words: loaded (and where from), building, off, or why it failed."""
    if _module is not None:
        return f"loaded from {_module.__file__}"
    if _error is not None:
        return f"failed: {_error}"
    if os.environ.get(ENV, "1") == "0":
        return f"off ({ENV}=0)"
    return "building" if _thread is not None else "not started"


def _build_and_load() -> None:
    global _module, _error
    try:
        try:
            path = _build()
        finally:
            _started.set()
        loader = importlib.machinery.ExtensionFileLoader(MODULE, str(path))
        spec = importlib.util.spec_from_file_location(MODULE, str(path), loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        _module = module
    except Exception as e:  # the Python path still works: say why the fast one is missing, once
        _error = f"{type(e).__name__}: {e}"
        warnings.warn(f"opbuilder: to_torch's C++ bridge could not be built, so calls take the Python path "
                      f"(slower on small tensors): {_error}", RuntimeWarning, stacklevel=2)


def _torch_dir() -> Path:
    import torch
    return Path(torch.__file__).parent


def _build() -> Path:
    """The bridge's library in the cache, compiled first if it is not there."""
    import torch
    root = cache_root()
    cxx = find_compiler(root)
    source = include_dir() / "opbuilder" / "torch_bridge.cpp"
    api = include_dir() / "opbuilder" / "detail" / "foreign_api.h"
    tdir = _torch_dir()
    key = digest_of([torch.__version__, str(tdir), source.read_text(), api.read_text(), cxx.identity, python_abi()])
    out_dir = root / "_obtorch" / key
    target = out_dir / (MODULE + ext_suffix())
    if target.is_file():
        _started.set()
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    with build_lock(out_dir, "torch bridge"):
        if target.is_file():  # another process built it while we waited
            return target
        for stale in out_dir.glob(f".{MODULE}.*.tmp"):  # left by a process that exited mid-build
            stale.unlink(missing_ok=True)
        tmp = out_dir / f".{MODULE}.{os.getpid()}.tmp"
        argv = [*cxx.argv, *_flags(torch, tdir), str(source), "-o", str(tmp), *_link_flags(tdir)]
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
            _started.set()
            _, stderr = proc.communicate()
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise RuntimeError(f"{' '.join(argv[:2])} ... exited {proc.returncode}:\n{stderr[-4000:]}")
        os.replace(tmp, target)
    return target


def _flags(torch: ModuleType, tdir: Path) -> List[str]:
    import sysconfig
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    return ["-std=c++20", "-O2", "-fPIC", "-shared", "-fvisibility=hidden", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            f"-I{include_dir()}", f"-I{tdir / 'include'}", f"-I{tdir / 'include' / 'torch' / 'csrc' / 'api' / 'include'}",
            f"-I{sysconfig.get_paths()['include']}"]


def _link_flags(tdir: Path) -> List[str]:
    lib = tdir / "lib"
    return [f"-L{lib}", f"-Wl,-rpath,{lib}", "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]


if __name__ == "__main__":  # python -m opbuilder.torch_bridge: build it now and say where it is
    ready(wait=True)
    print(status())
    sys.exit(0 if _module is not None else 1)
