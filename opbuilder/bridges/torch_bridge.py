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
import time
import warnings
from pathlib import Path
from types import ModuleType
from typing import Optional

from ..cache.cache_dir import cache_root
from ..errors import BuildError
from ..native.torch_bridge_build import KIND, MODULE, bridge_spec

__all__ = ["ready", "request", "build_detached", "loaded", "status", "enabled", "bridge_spec", "ENV", "MODULE", "KIND"]

ENV = "OPBUILDER_TORCH_BRIDGE"  # "0": to_torch stays on its Python path
_lock = threading.Lock()
_module: Optional[ModuleType] = None
_error: Optional[str] = None
_thread: Optional[threading.Thread] = None
_started = threading.Event()  # the build's compiler is running, or there is nothing to compile
_lookup: Optional[threading.Thread] = None  # request()'s look-up in the cache, once per process
_detached: Optional[int] = None  # the pid of the build request() started in a detached process
_note: Optional[str] = None  # why request() found no bridge and started no build (status())
_FAILED = ".detached-build.failed"  # in the bridge's cache directory: what a detached build's failure said
_FAILED_FOR_S = 24 * 3600  # how long it stops others: a failure may be passing (a full disk, a killed compiler)


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
    loaded if the cache has it; else its build starts in a detached process, for later processes,
    unless no build may or should run (``status()`` then says why). Nothing is raised or printed: the
    caller's path works either way, and ``ready()`` (to_torch) still builds and loads it itself."""
    global _lookup
    if not enabled() or _module is not None or _error is not None:
        return
    # filelock registers fork hooks of its own when first imported: here, not in the look-up while a
    # fork waits for it in _finish_lookup (its "after" hook would then run without its "before")
    from ..cache import lock  # noqa: F401

    with _lock:
        if _lookup is not None or _thread is not None:
            return
        _lookup = threading.Thread(target=_look_up, name="opbuilder-torch-bridge-lookup", daemon=True)
        os.register_at_fork(before=_finish_lookup)  # once: this block runs once per process
        _lookup.start()


_fork_waited_out = False  # a fork waited for the look-up in vain (a hung file system): later ones do not


def _finish_lookup() -> None:
    """Before a fork: let request()'s look-up end (milliseconds), so that the child inherits no
    half-imported module, or a lock, held by a thread it does not have."""
    global _fork_waited_out
    lookup = _lookup
    if _fork_waited_out or lookup is None or not lookup.is_alive() or lookup is threading.current_thread():
        return
    lookup.join(timeout=10)
    _fork_waited_out = lookup.is_alive()


def _look_up() -> None:
    """request()'s thread: load the bridge from the cache, or start its detached build."""
    global _module, _detached, _note
    import logging

    from ..cache.shipped import lookups_only
    from ..errors import NoBuildError

    log = logging.getLogger("opbuilder")
    try:
        with lookups_only():
            _module = _load()
        return
    except NoBuildError as e:  # not in the cache; raised while looking for a compiler: there is none
        if isinstance(e.__context__, FileNotFoundError):
            _note = "not in the cache, and no C++ compiler here to build it"
            return
    except Exception as e:  # ready() tries again, and says why if it fails there too
        _note = f"not loaded from the cache: {type(e).__name__}: {e}"
        log.info("opbuilder: to_torch's C++ bridge %s", _note)
        return
    try:
        _note = _why_not_detached()
        if _note is None:
            _detached = _start_detached()
            log.info("opbuilder: building to_torch's C++ bridge in the background (pid %d)", _detached)
    except Exception as e:  # a cache that cannot be written, ...
        _note = f"not in the cache, and not built in the background: {type(e).__name__}: {e}"
        log.info("opbuilder: to_torch's C++ bridge is %s", _note)


def _op_dir() -> Path:
    """The bridge's directory in the cache (checked as every build's is)."""
    from ..builder import _trusted

    return _trusted(bridge_spec(cache_root())).op_dir


def _build_inputs() -> str:
    """What a detached build's failure is remembered for: the compiler and torch (their versions)."""
    from ..tools.toolchain import find_compiler

    import torch
    cxx = find_compiler(cache_root())
    return f"{' '.join(cxx.argv)}\n{cxx.identity}\ntorch {torch.__version__}\n"


def _why_not_detached() -> Optional[str]:
    """Why request() starts no detached build, or None: it may and should."""
    from ..cache.lock import try_lock
    from ..compile import detached
    from ..spec import no_build

    if no_build():
        return "not in the cache, and OPBUILDER_NO_BUILD=1 forbids building it"
    why = detached.can_start()
    if why is not None:
        return f"not in the cache, and not built in the background: {why}"
    op_dir = _op_dir()
    if not os.access(op_dir if op_dir.is_dir() else op_dir.parent, os.W_OK):
        return f"not in the cache, which this process cannot write ({op_dir})"
    if op_dir.is_dir():
        with try_lock(op_dir) as free:
            if not free:
                return "not in the cache; another process is building it"
        failed = op_dir / _FAILED
        try:
            said = failed.read_text() if time.time() - failed.stat().st_mtime < _FAILED_FOR_S else ""
        except OSError:
            said = ""
        if said.startswith(_build_inputs()):  # the same compiler and torch, today: it would fail again
            return (f"not in the cache; its background build failed today ({failed}); to_torch builds it "
                    f"in the foreground and says why it fails; `python -m opbuilder cache clean {MODULE}` "
                    f"forgets the failure")
    return None


def _start_detached() -> int:
    """Start build_detached in a process that outlives this one (compile/detached.py); its pid."""
    from ..compile import detached

    root = str(Path(__file__).resolve().parents[2])  # the directory that holds the opbuilder package
    return detached.start(detached.ON_PATH + _DETACHED, [root], os.environ)


_DETACHED = "from opbuilder.bridges.torch_bridge import build_detached; sys.exit(build_detached())"


def build_detached() -> int:
    """In the detached process request() starts: build the bridge at a lower priority, unless another
    process is at it. A failure is written beside its builds (``.detached-build.failed``, with the
    compiler and torch it was for), so later processes start no build that would fail the same way."""
    from ..cache.lock import try_lock
    from ..cache.trust import make_dir, write_file

    op_dir = make_dir(_op_dir())
    with try_lock(op_dir) as free:
        if not free:
            return 0
    try:
        os.nice(10)  # the work in the foreground comes first
    except OSError:
        pass
    os.environ[ENV] = "1"
    if ready(wait=True) is not None:
        (op_dir / _FAILED).unlink(missing_ok=True)
        return 0
    write_file(op_dir / _FAILED, (_build_inputs() + (_error or "") + "\n").encode())
    return 1


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
        if _alive(_detached):
            return f"building in a detached process (pid {_detached}), for the next processes"
        return f"not loaded; a detached process (pid {_detached}) built it for the next processes, or failed"
    if _lookup is not None and _lookup.is_alive():
        return "looking in the cache"
    return _note or "not started"


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (not ours to reap: detached.py)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
    ready(wait=True)
    print(status())
    sys.exit(0 if _module is not None else 1)
