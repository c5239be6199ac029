"""``runtime.cuda``: is a GPU usable, and CUDA streams, over CuPy.

CuPy is optional (``pip install 'opbuilder[cuda12]'`` or ``[cuda13]``) and
imported only by these functions, never by ``import runtime``.
``is_available()`` and ``device_count()`` answer False / 0 on a machine
without CuPy, without an NVIDIA driver or a device, with a driver older than
CuPy's CUDA, or where CuPy cannot load the CUDA libraries its kernels need
(NVRTC, cuBLAS), without raising; ``unavailable_reason()`` says which.
Streams are CuPy's: ``with runtime.cuda.stream(s):`` makes ``s`` current, so
built-in ops (CuPy), C++ Function ops (``opbuilder::cuda::CurrentStream()``)
and aot ops (their ``stream`` argument) launch on it.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator, Optional

__all__ = ["is_available", "device_count", "unavailable_reason", "Stream", "stream", "current_stream",
           "synchronize"]

_INSTALL = "pip install 'opbuilder[cuda12]' (or 'opbuilder[cuda13]' for a CUDA 13 driver)"
_INSUFFICIENT_DRIVER = 35  # cudaErrorInsufficientDriver
_NO_DEVICE = 100  # cudaErrorNoDevice


def _version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


@functools.lru_cache(maxsize=None)
def _probe() -> "tuple[int, Optional[str]]":
    """(device count, None) or (0, why no device is usable); asked once per process."""
    try:
        import cupy
    except ImportError as e:
        return 0, f"CuPy is not installed ({e}); {_INSTALL}"
    except Exception as e:  # a broken CuPy install: a missing CUDA library, a bad build
        return 0, f"CuPy could not be imported: {type(e).__name__}: {e}"
    rt = cupy.cuda.runtime
    try:
        n = rt.getDeviceCount()
    except Exception as e:
        status = getattr(e, "status", None)
        if status == _INSUFFICIENT_DRIVER:
            try:
                driver = rt.driverGetVersion()
            except Exception:
                driver = None
            if driver == 0:  # CUDA's answer when no driver (libcuda) is installed
                return 0, "no NVIDIA driver is installed (the CUDA runtime found no libcuda)"
            have = "unknown" if driver is None else _version(driver)
            return 0, (f"the NVIDIA driver is too old: it supports CUDA {have}, CuPy was built for CUDA "
                       f"{_version(rt.runtimeGetVersion())}; update the driver or install the CuPy for its CUDA "
                       f"major ({_INSTALL})")
        if status == _NO_DEVICE:
            return 0, "no CUDA device is visible (none installed, or hidden by CUDA_VISIBLE_DEVICES)"
        return 0, f"CUDA could not be initialised: {type(e).__name__}: {e}"
    if n == 0:
        return 0, "no CUDA device is visible (none installed, or hidden by CUDA_VISIBLE_DEVICES)"
    missing = _library_problem(cupy)
    if missing is not None:
        return 0, missing
    return int(n), None


def _library_problem(cupy: Any) -> Optional[str]:
    """Why CuPy cannot run its kernels (NVRTC compiles every one, cuBLAS does matmul), or None.

    The cupy-cudaXXx wheels bring neither: they come from a CUDA toolkit or the ``[ctk]`` extra.
    Needs no device: only the libraries are loaded.
    """
    from opbuilder.diagnose.doctor_cuda import cupy_library_problems  # doctor's check of the same libraries

    missing = cupy_library_problems(cupy)
    if not missing:
        return None
    major = int(cupy.cuda.runtime.runtimeGetVersion()) // 1000
    return (f"CuPy cannot load the CUDA libraries its kernels need: {'; '.join(missing)}; "
            f"pip install 'cupy-cuda{major}x[ctk]', or install the CUDA {major} toolkit")


def is_available() -> bool:
    """True when CuPy imports and at least one CUDA device can be used."""
    return _probe()[0] > 0


def device_count() -> int:
    """The number of usable CUDA devices (0 without CuPy or a device; never raises)."""
    return _probe()[0]


def unavailable_reason() -> Optional[str]:
    """Why no GPU can be used here (no CuPy, no device, driver too old), or None when one can."""
    return _probe()[1]


def _cupy() -> Any:
    """The cupy module, once a device is known to be usable; ValueError saying why not otherwise."""
    why = unavailable_reason()
    if why is not None:
        raise ValueError(f"no usable GPU: {why}")
    import cupy
    return cupy


class Stream:
    """A CUDA stream (CuPy's ``cupy.cuda.Stream``); ``ptr`` is its ``cudaStream_t``."""

    def __init__(self, non_blocking: bool = False, *, _wrap: Any = None) -> None:
        self._stream = _wrap if _wrap is not None else _cupy().cuda.Stream(non_blocking=non_blocking)

    @property
    def ptr(self) -> int:
        """The ``cudaStream_t`` as an int (0 for the legacy default stream)."""
        return int(self._stream.ptr)

    def synchronize(self) -> None:
        """Wait until everything queued on this stream has run."""
        self._stream.synchronize()

    def query(self) -> bool:
        """True when everything queued on this stream has run."""
        return bool(self._stream.done)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other.ptr == self.ptr

    def __hash__(self) -> int:
        return hash(self.ptr)

    def __repr__(self) -> str:
        return f"<runtime.cuda.Stream ptr=0x{self.ptr:x}>"


@contextlib.contextmanager
def stream(s: Any) -> Iterator[Any]:
    """Make ``s`` (a ``Stream`` or a CuPy stream) current for the block; ops inside launch on it."""
    inner = s._stream if isinstance(s, Stream) else s
    if not hasattr(inner, "ptr") or not hasattr(inner, "use"):
        raise TypeError(f"runtime.cuda.stream takes a runtime.cuda.Stream (or a cupy.cuda.Stream), got "
                        f"{type(s).__name__}")
    with inner:
        yield s


def current_stream() -> Stream:
    """The stream ops launch on now (CuPy's current stream)."""
    return Stream(_wrap=_cupy().cuda.get_current_stream())


def synchronize() -> None:
    """Wait for all work on the current device to finish."""
    _cupy().cuda.Device().synchronize()
