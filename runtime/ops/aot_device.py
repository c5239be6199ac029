"""Calling an aot C function on GPU tensors: device pointers in, CuPy outputs out, the current stream.

The host path (aot_call.cpp's ``run``) reads numpy arrays; this one reads
CuPy arrays: ``params`` are device pointers (inputs made C-contiguous on
their device: a strided view goes as a contiguous copy, so an in-place write
to it is lost; outputs and Init's workspaces allocated from CuPy's pool),
``stream`` is CuPy's current stream (``runtime.cuda.stream(s)`` sets it;
never stream 0 by accident), and nothing synchronizes around the call: the
kernel is ordered on that stream like every CuPy op. The call itself is
aot_call.cpp's ``call_at``, on the host path's own (the kernel's own ``extra``, its
failure raised with its own error text), reached through ``call_pointers``,
which runs on host memory too: only ``call_on_device`` needs a GPU.
"""
from __future__ import annotations

import contextlib
import ctypes
from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np

from ..device import device_of

__all__ = ["call_on_device", "call_pointers", "init_on_device", "INIT_TYPE"]

_I64P = ctypes.POINTER(ctypes.c_int64)
INIT_TYPE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(_I64P),
                             ctypes.POINTER(ctypes.c_char_p), ctypes.c_void_p)
_NAMES = {n: n.encode() for n in ("float16", "bfloat16", "float32", "float64", "complex64", "complex128", "int8",
                                   "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool")}
Layout = Tuple[Tuple[int, ...], Any]  # (shape, dtype) of one param
_CURRENT = contextlib.nullcontext()  # the inputs' device is current already: entering it costs ~1 us


def call_on_device(call_at: Callable[..., None], fn: int, extra: int, arrays: Sequence[Any],
                   specs: Sequence[Tuple[Tuple[int, ...], np.dtype]], scratch_sizes: Sequence[int],
                   what: str) -> List[Any]:
    """The outputs of the aot function at address ``fn`` on CuPy ``arrays`` (all on one device).

    The device part only: the params on the device and the current stream. The call is ``call_pointers``,
    the one the host path's tests run; a failure raises the call path's KernelFailed."""
    from ..device_memory import _cp
    cp = _cp()
    devices = {device_of(a) for a in arrays}
    if len(devices) > 1:
        from ..device import DeviceMismatchError
        raise DeviceMismatchError(f"{what}: expected all inputs on one device, but found {' and '.join(sorted(devices))}")
    index = arrays[0].device.id
    with (cp.cuda.Device(index) if index != cp.cuda.runtime.getDevice() else _CURRENT):
        ins = [a if a.flags.c_contiguous else cp.ascontiguousarray(a) for a in arrays]
        outs = [cp.empty(shape, dtype=dt) for shape, dt in specs]
        scratch = [cp.empty(int(n), dtype=cp.uint8) for n in scratch_sizes]
        every = ins + outs + scratch
        call_pointers(call_at, fn, extra, [a.data.ptr for a in every], [(a.shape, a.dtype) for a in every],
                      cp.cuda.get_current_stream().ptr)
    return outs


def call_pointers(call_at: Callable[..., None], fn: int, extra: int, pointers: Sequence[int],
                  layouts: Sequence[Layout], stream: int) -> None:
    """Call the aot function at ``fn`` on params at these addresses, of these (shape, dtype), through
    ``call_at`` (the compiled call path's: the kernel gets its own ``extra``, runs without the GIL, and a
    failure raises KernelFailed(status, error text)). Device or host memory alike."""
    call_at(fn, extra, tuple(pointers), tuple(tuple(shape) for shape, _ in layouts),
            tuple(_abi_name(dt) for _, dt in layouts), stream)


_ABI_NAME_OF: Dict[Any, str] = {}  # dtype -> its ABI name: numpy's dtype.name costs ~2 us a call


def _abi_name(dt: Any) -> str:
    """The aot ABI's name of a dtype ("float32", "bool", "bfloat16")."""
    name = _ABI_NAME_OF.get(dt)
    if name is None:
        d = np.dtype(dt)
        name = "bool" if d == np.bool_ else d.name
        if name not in _NAMES:
            raise TypeError(f"aot operators take no {name} tensors (they take {', '.join(_NAMES)})")
        _ABI_NAME_OF[dt] = name
    return name


def init_on_device(fn: int, extra: int, arrays: Sequence[Any],
                   specs: Sequence[Tuple[Tuple[int, ...], np.dtype]]) -> int:
    """Status of ``<Symbol>Init`` (shapes and dtypes of inputs and outputs; no data is touched)."""
    ndims, shapes, dtypes, _keep = _describe([(a.shape, a.dtype) for a in arrays] + list(specs))
    return int(INIT_TYPE(fn)(ndims, shapes, dtypes, extra))


def _describe(items: Sequence[Layout]) -> Tuple[Any, Any, Any, List[Any]]:
    """ndims, shapes and dtypes arrays for the C ABI (and the buffers they point into, to keep alive)."""
    n = max(len(items), 1)
    ndims = (ctypes.c_int * n)(*[len(shape) for shape, _ in items])
    dims = [(ctypes.c_int64 * max(len(shape), 1))(*shape) for shape, _ in items]
    shapes = (_I64P * n)(*[ctypes.cast(d, _I64P) for d in dims])
    dtypes = (ctypes.c_char_p * n)(*[_NAMES["bool" if np.dtype(dt) == np.bool_ else np.dtype(dt).name]
                                     for _, dt in items])
    return ndims, shapes, dtypes, dims
