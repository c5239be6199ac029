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
           "DeviceMismatchError", "like", "add_at", "writeable", "on_default_device"]

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


def like(value: Any, arr: Any, what: str) -> Any:
    """``value`` (a number, list, numpy or CuPy array) as an array on ``arr``'s device.

    Host data next to a GPU ``arr`` (indices, masks, constants: what numpy code
    builds with ``np.asarray``) is copied there, since CuPy refuses numpy arrays
    in its calls; GPU data next to an array on another device is a
    ``DeviceMismatchError`` naming ``what``, not an implicit copy.
    """
    if isinstance(arr, np.ndarray):
        if is_device_array(value):
            raise DeviceMismatchError(f"{what} is on {device_of(value)} but the tensor it goes with is on CPU; "
                                      f"move it with Tensor.to(device) or Tensor.move_to(...)")
        return np.asarray(value)
    if is_device_array(value):
        if device_of(value) != device_of(arr):
            raise DeviceMismatchError(f"{what} is on {device_of(value)} but the tensor it goes with is on "
                                      f"{device_of(arr)}; move it with Tensor.to(device) or Tensor.move_to(...)")
        return value
    return to_device(np.asarray(value), device_of(arr))


def add_at(out: Any, index: Any, values: Any) -> None:
    """``out[index] += values`` with repeated indices accumulating (numpy's ``np.add.at``, CuPy's
    ``cupyx.scatter_add``; CuPy does not dispatch ufunc methods such as ``np.add.at``)."""
    if isinstance(out, np.ndarray):
        np.add.at(out, index, values)
    else:
        import cupyx
        cupyx.scatter_add(out, index, values)


def writeable(arr: Any) -> bool:
    """Whether ``arr`` may be written in place: numpy's flag (a broadcast view, a bytes buffer or a
    read-only memory map is not); CuPy arrays have no read-only form (and no such flag)."""
    return getattr(arr.flags, "writeable", True)


def on_default_device(arr: np.ndarray) -> Any:
    """A host array made by a constructor (zeros, an initializer's values) on the context's device
    (``set_context(device_target=...)``): itself on the CPU, a copy on a GPU."""
    from .context import default_device
    device = default_device()
    return arr if device == CPU else to_device(arr, device)


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
