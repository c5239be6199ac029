"""The compiled call path of aot operators (aot_call.cpp beside this file), built once and kept.

It is an operator like any other for the builder: compiled on first use into
the cache (about a second), then imported in milliseconds by every later
process. The numpy version is part of its build flags, so an upgraded numpy
gets a fresh build.
"""
from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from types import ModuleType
from typing import Optional

from .aot_extra import ABI_VERSION, ExtraData

__all__ = ["trampoline"]

_SOURCE = Path(__file__).with_name("aot_call.cpp")
_module: Optional[ModuleType] = None
_lock = threading.Lock()


def trampoline() -> ModuleType:
    """The ``run``/``init``/``release`` module (built on the first call in a fresh cache)."""
    global _module
    if _module is not None:
        return _module
    with _lock:
        if _module is None:
            import numpy as np
            from opbuilder import CustomOpBuilder
            mod = CustomOpBuilder("_opbuilder_aot_call", [_SOURCE], backend="CPU",
                                  cflags=["-isystem", np.get_include(), f"-DOB_NUMPY_VERSION={np.__version__}"]
                                  ).load()
            if mod.ABI_VERSION != ABI_VERSION or mod.EXTRA_SIZE != ctypes.sizeof(ExtraData):
                raise RuntimeError(f"aot_call.cpp and aot_extra.py disagree on the AotExtra layout (ABI "
                                   f"{mod.ABI_VERSION} vs {ABI_VERSION}, size {mod.EXTRA_SIZE} vs "
                                   f"{ctypes.sizeof(ExtraData)}); reinstall opbuilder")
            _module = mod
    return _module
