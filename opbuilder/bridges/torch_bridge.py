"""The C++ bridge to PyTorch: to_torch's fast path, built once per torch build, in the background.

A Python ``torch.autograd.Function`` costs more than a small C++ operator itself (benchmarks/interop.py's
floor row). So to_torch's eager calls go through ``_opbuilder_torch_bridge`` (src/torch_bridge.cpp),
a module compiled against libtorch: torch tensors reach the operator as views of their memory, results
come back as torch tensors over the memory the kernel wrote, and a C++ ``Function``'s node is a C++
``torch::autograd::Node`` whose backward calls ``Backward`` without Python in between. Once it is
loaded, a to_torch namespace's function is the bridge's ``Op`` itself: an eager call runs no Python
before the operator (torch.compile traces the Op's Python ``__call__``, to_torch's Python path).

Compiling against torch's headers takes ~15 s (30-60 s on a busy machine), once per torch build, compiler
and opbuilder version. It is built through the pipeline every operator takes (``bridge_spec``): the
result is cached as ``_opbuilder_torch_bridge.lib`` in the cache root, checked like any build (a link
or a directory others can write is refused; a damaged library is built again), listed by
``python -m opbuilder cache list`` and removed by ``cache clean``; the build shows the same progress
line on stderr as an operator's. ``to_torch`` never waits for it: the first call
starts the build on a thread, and calls take the Python path (same results) until the bridge is loaded.
``OPBUILDER_TORCH_BRIDGE=0`` keeps every call on the Python path; ``ready(wait=True)`` waits for it.
"""
from __future__ import annotations

import os
import sys
import threading
import warnings
from types import ModuleType
from typing import Optional

from ..cache.cache_dir import cache_root
from ..errors import BuildError
from ..native.torch_bridge_build import KIND, MODULE, bridge_spec

__all__ = ["ready", "loaded", "status", "enabled", "bridge_spec", "ENV", "MODULE", "KIND"]

ENV = "OPBUILDER_TORCH_BRIDGE"  # "0": to_torch stays on its Python path
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


def loaded() -> Optional[ModuleType]:
    """The bridge if it is loaded now, else None; starts nothing (``ready`` starts the build)."""
    return _module if enabled() else None


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
        _module = _load()
    except Exception as e:  # the Python path still works: say why the fast one is missing, once
        _error = f"{type(e).__name__}: {e}"
        warnings.warn(f"opbuilder: to_torch's C++ bridge could not be built, so calls take the Python path "
                      f"(slower on small tensors): {_error}", RuntimeWarning, stacklevel=2)
    finally:
        _started.set()


def _load() -> ModuleType:
    """The bridge, built if needed and imported. A library the loader rejects (damaged after its
    checks passed) is forgotten and built once more, as load() does for an operator."""
    from ..builder import _build_checked, _distrust, _trusted
    from ..importer import import_extension, loader_error
    from ..compile.ninja_run import when_started
    from ..retry import retrying
    from ..cache.trust import stamp_of

    spec = _trusted(bridge_spec(cache_root()))
    for attempt in range(2):
        with when_started(_started.set):  # ready(until_started=True) returns once the compiler runs
            built = retrying(MODULE, lambda: _build_checked(spec, trusted=True))
        _started.set()
        stamp = stamp_of(os.lstat(built.library))
        try:
            return import_extension(MODULE, built.library)
        except BuildError as e:
            if attempt or not (loader_error(e.__cause__) and built.in_cache):
                raise
            _distrust(built.spec, built.library, stamp, e.__cause__)
    raise AssertionError("unreachable")


if __name__ == "__main__":  # python -m opbuilder.bridges.torch_bridge: build it now and say where it is
    ready(wait=True)
    print(status())
    sys.exit(0 if _module is not None else 1)
