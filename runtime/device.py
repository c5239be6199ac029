"""Devices: names, the device an array lives on, and the array module that computes there.

A tensor's data is a numpy array (device ``"CPU"``) or a CuPy array (device
``"GPU:N"``). Ops are written once against numpy's API; numpy hands a ufunc
or ``np.sum`` on CuPy arrays to CuPy (``__array_ufunc__`` /
``__array_function__``), and the few places that *create* arrays ask
``array_module`` for numpy or CuPy. Nothing here imports CuPy unless a GPU
device is asked for, so the CPU path never loads it.
"""
from __future__ import annotations

import re
from typing import Any, Iterable

import numpy as np

__all__ = ["CPU", "parse_device", "device_of", "array_module", "is_device_array", "to_device", "check_same",
           "DeviceMismatchError"]

CPU = "CPU"
_FORMS = "'CPU', 'GPU', 'GPU:N', 'cuda', 'cuda:N'"
_PATTERN = re.compile(r"(cpu|gpu|cuda)(?::(\d+))?", re.IGNORECASE)


class DeviceMismatchError(RuntimeError):
    """An op was given tensors on two different devices."""


def parse_device(spec: Any) -> str:
    """``"CPU"`` or ``"GPU:N"`` for a device name; a bare ``"GPU"``/``"cuda"`` is context's device_id.

    Only the name is checked here (no CuPy import): whether the device can be
    used is decided when memory is first put there.
    """
    if not isinstance(spec, str):
        raise TypeError(f"device must be a string ({_FORMS}), got {type(spec).__name__}")
    m = _PATTERN.fullmatch(spec.strip())
    if m is None:
        raise ValueError(f"device {spec!r} is not a device name; accepted: {_FORMS}")
    kind, index = m.group(1).lower(), m.group(2)
    if kind == "cpu":
        if index not in (None, "0"):
            raise ValueError(f"device {spec!r}: there is one CPU device (write 'CPU')")
        return CPU
    if index is None:
        from .context import get_context
        index = get_context("device_id")
    return f"GPU:{int(index)}"


def is_device_array(data: Any) -> bool:
    """True for an array in GPU memory (CuPy's, or anything with ``__cuda_array_interface__``)."""
    return type(data) is not np.ndarray and hasattr(data, "__cuda_array_interface__")


def device_of(arr: Any) -> str:
    """The device of a tensor's data: ``"CPU"`` for numpy, ``"GPU:N"`` for CuPy."""
    if isinstance(arr, np.ndarray):
        return CPU
    dev = getattr(arr, "device", None)
    return f"GPU:{int(getattr(dev, 'id', 0))}"


def array_module(arr: Any) -> Any:
    """numpy for a host array, cupy for a device array (the module to create arrays with)."""
    if isinstance(arr, np.ndarray):
        return np
    from .cuda import _cupy
    return _cupy()


def to_device(arr: Any, device: str) -> Any:
    """``arr`` (numpy or CuPy) on ``device`` (a parsed name): itself when already there, else a copy."""
    if device == CPU:
        if isinstance(arr, np.ndarray):
            return arr
        return arr.get() if hasattr(arr, "get") else _cupy_module().asnumpy(arr)
    from .cuda import device_count, unavailable_reason
    why = unavailable_reason()
    if why is not None:
        raise ValueError(f"device {device} is not usable: {why}")
    cp = _cupy_module()
    index = int(device.split(":")[1])
    if index >= device_count():
        raise ValueError(f"device {device}: this machine has {device_count()} CUDA device(s)")
    if not isinstance(arr, np.ndarray) and device_of(arr) == device:
        return arr
    with cp.cuda.Device(index):
        return cp.asarray(arr)


def _cupy_module() -> Any:
    from .cuda import _cupy
    return _cupy()


def check_same(tensors: Iterable[Any], what: str) -> None:
    """``DeviceMismatchError`` naming both devices when ``tensors`` (runtime Tensors) are on two devices."""
    first = None
    for t in tensors:
        data = getattr(t, "_data", None)
        if data is None:
            continue
        dev = device_of(data)
        if first is None:
            first = dev
        elif dev != first:
            raise DeviceMismatchError(f"{what}: expected all tensors on one device, but found tensors on {first} "
                                      f"and on {dev}; move them with Tensor.to(device) or Tensor.move_to(...)")
