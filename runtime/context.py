"""Run settings, as MindSpore scripts set them: ``set_context(mode=..., device_target=...)``.

``runtime.set_context`` / ``runtime.get_context`` and this module's
``GRAPH_MODE`` / ``PYNATIVE_MODE`` let a MindSpore script run with only its
imports changed. What each setting does here:

- ``device_target``: ``"CPU"`` (numpy arrays in host memory) or ``"GPU"``
  (CuPy arrays on CUDA device ``device_id``): new tensors are made there.
  ``"GPU"`` without a usable device is a ``ValueError`` saying why (CuPy not
  installed, no device, driver too old); checking it imports CuPy, choosing
  ``"CPU"`` never does. ``"Ascend"`` is not supported.
- ``mode``: ``GRAPH_MODE`` makes calling an ``nn.Cell`` run its ``construct``
  through ``runtime.jit`` (traced once per signature, run on ``ms_backend``);
  ``PYNATIVE_MODE`` runs it eagerly. Results and gradients are the same.
- ``device_id``: a non-negative int: the GPU that ``"GPU"`` means (there is one CPU device).
"""
from __future__ import annotations

from typing import Any, Dict, Tuple

__all__ = ["GRAPH_MODE", "PYNATIVE_MODE", "set_context", "get_context", "available_targets", "default_device"]

GRAPH_MODE = 0
PYNATIVE_MODE = 1
_MODES = {GRAPH_MODE: "GRAPH_MODE", PYNATIVE_MODE: "PYNATIVE_MODE"}
_KNOWN_TARGETS = ("CPU", "GPU", "Ascend")  # MindSpore's names

_settings: Dict[str, Any] = {"mode": PYNATIVE_MODE, "device_target": "CPU", "device_id": 0}
_default_device = "CPU"  # what new tensors get: "CPU" or "GPU:<device_id>"


def available_targets() -> Tuple[str, ...]:
    """The device targets this runtime can run on here ("GPU" when CuPy sees a device; imports CuPy)."""
    from . import cuda
    return ("CPU", "GPU") if cuda.is_available() else ("CPU",)


def default_device() -> str:
    """The device new tensors are made on: ``"CPU"`` or ``"GPU:N"``."""
    return _default_device


def _check_target(value: Any) -> str:
    if value == "CPU":
        return value
    if value == "GPU":
        from . import cuda
        why = cuda.unavailable_reason()
        if why is None:
            return value
        raise ValueError(f"device_target 'GPU' is not usable here: {why}; available device targets: CPU")
    have = ", ".join(available_targets())
    if value == "Ascend":
        raise ValueError(f"device_target 'Ascend' is not available: this runtime has no Ascend support; "
                         f"available device targets: {have}")
    raise ValueError(f"device_target {value!r} is not a device target (MindSpore's are "
                     f"{', '.join(_KNOWN_TARGETS)}); available device targets: {have}")


def _check_mode(value: Any) -> int:
    if isinstance(value, bool) or value not in _MODES:
        raise ValueError(f"mode {value!r} is not a run mode; use context.GRAPH_MODE ({GRAPH_MODE}) or "
                         f"context.PYNATIVE_MODE ({PYNATIVE_MODE})")
    return int(value)


def _check_device_id(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"device_id must be a non-negative int, got {value!r}")
    return value


_CHECKS = {"mode": _check_mode, "device_target": _check_target, "device_id": _check_device_id}


def set_context(**kwargs: Any) -> None:
    """Set ``mode``, ``device_target`` and/or ``device_id``; all are checked before any is set."""
    unknown = sorted(set(kwargs) - set(_CHECKS))
    if unknown:
        raise ValueError(f"set_context: {', '.join(map(repr, unknown))} is not a setting of this runtime; "
                         f"settings: {', '.join(_CHECKS)}")
    global _default_device
    checked = {key: _CHECKS[key](value) for key, value in kwargs.items()}
    merged = {**_settings, **checked}
    if merged["device_target"] == "GPU":
        from . import cuda
        if merged["device_id"] >= cuda.device_count():
            raise ValueError(f"device_id {merged['device_id']} is not a GPU here: {cuda.device_count()} CUDA "
                             f"device(s) are visible")
    _settings.update(checked)
    _default_device = "CPU" if merged["device_target"] == "CPU" else f"GPU:{merged['device_id']}"


def get_context(attr_key: str) -> Any:
    """The value of one setting (``"mode"``, ``"device_target"``, ``"device_id"``)."""
    if attr_key not in _settings:
        raise ValueError(f"get_context: {attr_key!r} is not a setting of this runtime; settings: "
                         f"{', '.join(_settings)}")
    return _settings[attr_key]
