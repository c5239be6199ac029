"""Importing a built extension module from its path, with readable failures."""
from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Optional

from .errors import BuildError

__all__ = ["import_extension", "demangle"]


def demangle(symbol: str) -> str:
    """C++ name of a mangled symbol (via libstdc++'s __cxa_demangle; no process)."""
    try:
        lib = ctypes.CDLL("libstdc++.so.6")
        fn = lib.__cxa_demangle
        fn.restype = ctypes.c_void_p
        status = ctypes.c_int()
        ptr = fn(symbol.encode(), None, None, ctypes.byref(status))
        if status.value != 0 or not ptr:
            return symbol
        try:
            return ctypes.string_at(ptr).decode()
        finally:
            ctypes.CDLL(None).free(ctypes.c_void_p(ptr))
    except (OSError, AttributeError):
        return symbol


def _explain(err: ImportError) -> Optional[str]:
    m = re.search(r"undefined symbol: (\S+)", str(err))
    if m:
        sym = m.group(1)
        return (f"undefined symbol {demangle(sym)} ({sym}): declared and used but never defined; "
                f"add the source that defines it, or the library (ldflags=['-l...'])")
    return None


def import_extension(name: str, path: Path) -> ModuleType:
    """Load the extension at ``path`` as module ``name`` (not put in sys.modules)."""
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    assert spec is not None
    try:
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
    except ImportError as e:
        why = _explain(e) or str(e)
        raise BuildError(f"operator '{name}' was built but cannot be imported: {why}\nlibrary: {path}",
                         name=name, log=str(e)) from e
    return module
