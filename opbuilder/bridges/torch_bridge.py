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

An operator called straight on torch tensors (no to_torch) uses the bridge too once it is loaded: its
C++ reads a torch tensor for the core in a few field reads, where torch's Python API needs an
``is_neg`` call per argument. The first such call in a process asks for it (``request``): the bridge
is loaded on a thread if the cache has it; if not, its build starts in a detached process at a lower
priority (as the PCH's does), for the processes after this one, and this one compiles nothing.
"""
from __future__ import annotations

import os
import sys
import threading
import warnings
from pathlib import Path
from types import ModuleType
from typing import Optional

from ..cache.cache_dir import cache_root
from ..errors import BuildError
from ..native.torch_bridge_build import KIND, MODULE, bridge_spec

__all__ = ["ready", "request", "loaded", "status", "enabled", "bridge_spec", "ENV", "MODULE", "KIND"]

ENV = "OPBUILDER_TORCH_BRIDGE"  # "0": to_torch stays on its Python path
_lock = threading.Lock()
_module: Optional[ModuleType] = None
_error: Optional[str] = None
_thread: Optional[threading.Thread] = None
_started = threading.Event()  # the build's compiler is running, or there is nothing to compile
_lookup: Optional[threading.Thread] = None  # request()'s look-up in the cache, once per process
_detached: Optional[int] = None  # the pid of the build request() started in a detached process


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
    lookup = _lookup
    if lookup is not None and lookup.is_alive():  # request()'s look-up (milliseconds): its answer first
        lookup.join()
        if _module is not None:
            return _module
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


def request() -> None:
    """Ask for the bridge without waiting and without compiling in this process (an operator got a
    torch tensor straight: opbuilder._torch_tensor_seen). Once per process: on a thread, the bridge is
    loaded if the cache has it; else its build starts in a detached process (``python -m
    opbuilder.bridges.torch_bridge --detached``) for later processes, unless no build may run here
    (``OPBUILDER_NO_BUILD``, no compiler). Nothing is raised or warned: the caller's path works either
    way, and ``ready()`` (to_torch) still builds and loads the bridge itself, as before."""
    global _lookup
    if not enabled() or _module is not None or _error is not None:
        return
    with _lock:
        if _lookup is not None or _thread is not None:
            return
        _lookup = threading.Thread(target=_look_up, name="opbuilder-torch-bridge-lookup", daemon=True)
        _lookup.start()


def _look_up() -> None:
    """request()'s thread: load the bridge from the cache, or start its detached build."""
    global _module, _detached
    import logging

    from ..cache.shipped import lookups_only
    from ..errors import NoBuildError
    from ..spec import no_build

    try:
        with lookups_only():
            _module = _load()
    except NoBuildError as e:  # not in the cache; raised while looking for a compiler: none here
        if no_build() or isinstance(e.__context__, FileNotFoundError) or _being_built():
            return
        try:
            _detached = _start_detached()
            logging.getLogger("opbuilder").info("building to_torch's C++ bridge in the background (pid %d)",
                                                _detached)
        except OSError as err:
            logging.getLogger("opbuilder").info("not building to_torch's C++ bridge in the background: %s", err)
    except Exception as e:  # ready() tries again, and says why if it fails there too
        logging.getLogger("opbuilder").info("to_torch's C++ bridge is not loaded: %s: %s", type(e).__name__, e)


def _being_built() -> bool:
    """Whether another process (or thread) holds the bridge's build lock now: a detached build started
    then would only wait for it, holding torch in memory (many short processes would stack up)."""
    from ..builder import _trusted
    from ..cache.lock import try_lock

    op_dir = _trusted(bridge_spec(cache_root())).op_dir
    if not op_dir.is_dir():
        return False
    with try_lock(op_dir) as free:
        return not free


def _start_detached() -> int:
    """Start ``python -m opbuilder.bridges.torch_bridge --detached``, in its own session, with no
    terminal: it outlives this process. Returns its pid."""
    import subprocess

    root = str(Path(__file__).resolve().parents[2])  # the directory that holds the opbuilder package
    env = dict(os.environ, **{ENV: "1"})
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.Popen([sys.executable, "-m", __name__, "--detached"], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            close_fds=True)
    return proc.pid


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
    if _thread is not None:
        return "building"
    if _detached is not None:
        return f"building in a detached process (pid {_detached}), for the next processes"
    return "looking in the cache" if _lookup is not None and _lookup.is_alive() else "not started"


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


# What the core library calls, once per process, when a torch tensor first reaches an operator straight
# while the bridge is not loaded (include/opbuilder/detail/dlpack_exchange.h, AskForTorchBridge): it
# finds it through opbuilder's lazy names (``opbuilder._torch_tensor_seen``), as to_torch is found.
_torch_tensor_seen = request


if __name__ == "__main__":  # python -m opbuilder.bridges.torch_bridge: build it now and say where it is
    if "--detached" in sys.argv[1:]:  # request()'s build: after the work in the foreground, and only one
        if _being_built():
            sys.exit(0)
        try:
            os.nice(10)
        except OSError:
            pass
    ready(wait=True)
    print(status())
    sys.exit(0 if _module is not None else 1)
