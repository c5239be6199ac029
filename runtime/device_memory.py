"""The C++ side's way to GPU memory: allocation from CuPy's pool, and device arrays in and out.

include/opbuilder/tensor.h and detail/runtime_bridge.h call these (through
runtime/_native.py) for GPU tensors only (a CPU tensor never reaches this module, so the CPU path never
imports CuPy). Allocations come from CuPy's memory pool on the current
stream, so a Function op's outputs are ordered like every CuPy op.
"""
from __future__ import annotations

from typing import Any, Tuple

import numpy as np

__all__ = ["allocate", "describe", "wrap", "current_stream_ptr"]


_cupy_module: Any = None  # set by the first call: each op calls here several times, so it is looked up once


def _cp() -> Any:
    global _cupy_module
    cp = _cupy_module
    if cp is None:
        from .cuda import _cupy
        cp = _cupy_module = _cupy()
    return cp


def allocate(nbytes: int, device: int, zero: bool) -> Tuple[Any, int]:
    """(owner, device pointer): a block of ``nbytes`` from CuPy's pool on ``device``, ordered on the
    current stream (a ``cupy.cuda.MemoryPointer``, which owns it; no array around it: about half the
    cost of ``cupy.empty``)."""
    cp = _cp()
    if device != cp.cuda.runtime.getDevice():  # entering a Device costs about as much as the allocation
        with cp.cuda.Device(device):
            return _block(cp, nbytes, zero)
    return _block(cp, nbytes, zero)


def _block(cp: Any, nbytes: int, zero: bool) -> Tuple[Any, int]:
    mem = cp.cuda.alloc(nbytes)
    if zero and nbytes:
        mem.memset_async(0, nbytes)  # on the current stream, as cupy.zeros
    return mem, mem.ptr


def describe(arr: Any) -> Tuple[Any, int, Tuple[int, ...], np.dtype, int]:
    """(owner, device pointer, shape, numpy dtype, device) of a GPU array made C-contiguous on its device."""
    cp = _cp()
    if not isinstance(arr, cp.ndarray):
        arr = cp.asarray(arr)  # anything with __cuda_array_interface__, zero-copy
    if not arr.flags.c_contiguous:
        with arr.device:
            arr = cp.ascontiguousarray(arr)
    return arr, arr.data.ptr, arr.shape, arr.dtype, arr.device.id


def wrap(ptr: int, nbytes: int, shape: Tuple[int, ...], dtype: np.dtype, device: int, owner: Any) -> Any:
    """A C-contiguous CuPy array over ``nbytes`` at ``ptr`` on ``device``, keeping ``owner`` alive."""
    cp = _cp()
    if type(owner) is cp.cuda.MemoryPointer and owner.ptr == ptr and owner.device_id == device:
        return cp.ndarray(shape, dtype, owner)  # a whole block from allocate(): the array holds it itself
    mem = cp.cuda.UnownedMemory(ptr, nbytes, owner, device)
    return cp.ndarray(shape, dtype, cp.cuda.MemoryPointer(mem, 0))


def current_stream_ptr() -> int:
    """The current CUDA stream (``cudaStream_t`` as an int) that C++ code launches on."""
    return int(_cp().cuda.get_current_stream().ptr)
