"""Calling an aot C function on GPU tensors: device pointers in, CuPy outputs out, the current stream.

The host path (aot_call.cpp) reads numpy arrays; this one reads CuPy arrays:
``params`` are device pointers (inputs made C-contiguous on their device: a
strided view goes as a contiguous copy, so an in-place write to it is lost; outputs and Init's workspaces allocated from CuPy's pool), ``stream`` is
CuPy's current stream (``runtime.cuda.stream(s)`` sets it; never stream 0 by
accident), and nothing synchronizes around the call: the kernel is ordered
on that stream like every CuPy op.
"""
from __future__ import annotations

import ctypes
from typing import Any, List, Sequence, Tuple

import numpy as np

from ..device import device_of

__all__ = ["call_on_device", "init_on_device", "KERNEL_TYPE", "INIT_TYPE"]

_I64P = ctypes.POINTER(ctypes.c_int64)
KERNEL_TYPE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                               ctypes.POINTER(ctypes.c_int), ctypes.POINTER(_I64P), ctypes.POINTER(ctypes.c_char_p),
                               ctypes.c_void_p, ctypes.c_void_p)
INIT_TYPE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(_I64P),
                             ctypes.POINTER(ctypes.c_char_p), ctypes.c_void_p)
_NAMES = {"float16": b"float16", "float32": b"float32", "float64": b"float64", "int8": b"int8", "int16": b"int16",
          "int32": b"int32", "int64": b"int64", "uint8": b"uint8", "bool": b"bool"}


def call_on_device(fn: int, extra: int, arrays: Sequence[Any], specs: Sequence[Tuple[Tuple[int, ...], np.dtype]],
                   scratch_sizes: Sequence[int], what: str) -> "Tuple[int, List[Any]]":
    """(status, outputs) of the aot function at address ``fn`` on CuPy ``arrays``; all on one device."""
    from ..cuda import _cupy
    cp = _cupy()
    devices = {device_of(a) for a in arrays}
    if len(devices) > 1:
        from ..device import DeviceMismatchError
        raise DeviceMismatchError(f"{what}: expected all inputs on one device, but found {' and '.join(sorted(devices))}")
    index = arrays[0].device.id
    with cp.cuda.Device(index):
        ins = [cp.ascontiguousarray(a) for a in arrays]
        outs = [cp.empty(shape, dtype=dt) for shape, dt in specs]
        scratch = [cp.empty(int(n), dtype=cp.uint8) for n in scratch_sizes]
        every = ins + outs + scratch
        n = len(every)
        params = (ctypes.c_void_p * n)(*[a.data.ptr for a in every])
        ndims, shapes, dtypes, _keep = _describe([(a.shape, a.dtype) for a in every])
        stream = cp.cuda.get_current_stream().ptr
        status = KERNEL_TYPE(fn)(n, params, ndims, shapes, dtypes, stream, extra)
    return int(status), outs


def init_on_device(fn: int, extra: int, arrays: Sequence[Any],
                   specs: Sequence[Tuple[Tuple[int, ...], np.dtype]]) -> int:
    """Status of ``<Symbol>Init`` (shapes and dtypes of inputs and outputs; no data is touched)."""
    ndims, shapes, dtypes, _keep = _describe([(a.shape, a.dtype) for a in arrays] + list(specs))
    return int(INIT_TYPE(fn)(ndims, shapes, dtypes, extra))


def _describe(items: Sequence[Tuple[Tuple[int, ...], Any]]) -> Tuple[Any, Any, Any, List[Any]]:
    """ndims, shapes and dtypes arrays for the C ABI (and the buffers they point into, to keep alive)."""
    n = len(items)
    ndims = (ctypes.c_int * n)(*[len(shape) for shape, _ in items])
    dims = [(ctypes.c_int64 * max(len(shape), 1))(*shape) for shape, _ in items]
    shapes = (_I64P * n)(*[ctypes.cast(d, _I64P) for d in dims])
    dtypes = (ctypes.c_char_p * n)(*[_NAMES["bool" if np.dtype(dt) == np.bool_ else np.dtype(dt).name]
                                     for _, dt in items])
    return ndims, shapes, dtypes, dims
