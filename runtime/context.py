"""Run settings, as MindSpore scripts set them: ``set_context(mode=..., device_target=...)``.

``runtime.set_context`` / ``runtime.get_context`` and this module's
``GRAPH_MODE`` / ``PYNATIVE_MODE`` let a MindSpore script run with only its
imports changed. What each setting does here:

- ``device_target``: ``"CPU"`` is the one this runtime has (its tensors are
  numpy arrays in host memory). Any other target is a ``ValueError`` naming
  the available ones.
- ``mode``: ``GRAPH_MODE`` makes calling an ``nn.Cell`` run its ``construct``
  through ``runtime.jit`` (traced once per signature, run on ``ms_backend``);
  ``PYNATIVE_MODE`` runs it eagerly. Results and gradients are the same.
- ``device_id``: a non-negative int, stored (there is one CPU device).
"""
from __future__ import annotations

from typing import Any, Dict, Tuple

__all__ = ["GRAPH_MODE", "PYNATIVE_MODE", "set_context", "get_context", "available_targets"]

GRAPH_MODE = 0
PYNATIVE_MODE = 1
_MODES = {GRAPH_MODE: "GRAPH_MODE", PYNATIVE_MODE: "PYNATIVE_MODE"}
_KNOWN_TARGETS = ("CPU", "GPU", "Ascend")  # MindSpore's names

_settings: Dict[str, Any] = {"mode": PYNATIVE_MODE, "device_target": "CPU", "device_id": 0}


def available_targets() -> Tuple[str, ...]:
    """The device targets this runtime can run on."""
    return ("CPU",)


def _check_target(value: Any) -> str:
    have = ", ".join(available_targets())
    if value in available_targets():
        return value
    if value == "GPU":
        raise ValueError(f"device_target 'GPU' is not available yet: this runtime has no GPU support (its tensors "
                         f"are numpy arrays in host memory); available device targets: {have}")
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
    checked = {key: _CHECKS[key](value) for key, value in kwargs.items()}
    _settings.update(checked)


def get_context(attr_key: str) -> Any:
    """The value of one setting (``"mode"``, ``"device_target"``, ``"device_id"``)."""
    if attr_key not in _settings:
        raise ValueError(f"get_context: {attr_key!r} is not a setting of this runtime; settings: "
                         f"{', '.join(_settings)}")
    return _settings[attr_key]
