"""Why a built library could not be imported, in words: a missing ``PyInit_`` function, an undefined
symbol (demangled), a class pybind11 registered twice, a damaged file. Only a failed import asks
(importer.py imports this module then): a load() that succeeds never needs it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

__all__ = ["demangle", "loader_error"]


def demangle(symbol: str) -> str:
    """C++ name of a mangled symbol (via libstdc++'s __cxa_demangle; no process)."""
    import ctypes

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


# what the dynamic loader says of a file that is not a whole, valid library (truncated, zeroed, garbage);
# plain substrings, not a regex compiled at import: a warm load() never needs them (issue 21)
_LOADER = ("invalid ELF header", "file too short", "ELF load command", "cannot map zero-fill", "wrong ELF class",
           "ELF file", "cannot read file data", "only ET_DYN and ET_EXEC", "no dynamic section",
           "cannot open shared object file", "cannot apply additional memory protection")


def loader_error(err: BaseException) -> bool:
    """True if ``err`` (an ImportError) says the library file itself is damaged, so building it
    again can help (an undefined symbol or a missing init function would only fail again)."""
    if not isinstance(err, ImportError):
        return False
    text = str(err)
    return any(says in text for says in _LOADER)


def _module_name_hint(err: ImportError, path: Path) -> Optional[str]:
    """Why the library has no ``PyInit_<name>``: the module names its ``PyInit_`` functions declare,
    or none at all, and the macro that gives the operator's name."""
    import re

    m = re.search(r"module export function \(PyInit_(\w+)\)", str(err))
    if m is None:
        return None
    from .elf_symbols import exported_functions

    want = m.group(1)
    declared = sorted(f[len("PyInit_"):] for f in exported_functions(path, "PyInit_"))
    fix = (f"declare the module with OB_MODULE(m) (nanobind), or PYBIND11_MODULE(OB_EXTENSION_NAME, m) "
           f"(MS_EXTENSION_NAME also works): opbuilder names it '{want}', the operator's name")
    if declared:
        names = ", ".join(f"'{d}'" for d in declared)
        return f"the library declares the Python module {names}, not '{want}' (PyInit_{want} is missing); {fix}"
    return f"the library defines no Python module (no PyInit_ function); {fix}"


def _explain(err: ImportError, path: Optional[Path] = None) -> Optional[str]:
    """A readable reason for an import failure of the library at ``path``; None if there is none."""
    import re

    hint = _module_name_hint(err, path) if path is not None else None
    if hint:
        return hint
    m = re.search(r"undefined symbol: (\S+)", str(err))
    if m:
        sym = m.group(1)
        return (f"undefined symbol {demangle(sym)} ({sym}): declared and used but never defined; "
                f"add the source that defines it, or the library (ldflags=['-l...'])")
    m = re.search(r'generic_type: type "([^"]+)" is already registered', str(err))
    if m:
        return (f"{err}: pybind11 registers a C++ class once per process, and an earlier build loaded "
                f"in this process registered \"{m.group(1)}\"; to reload a module with classes in the same "
                f"process, declare them with py::module_local() (or in an anonymous namespace), "
                f"or restart Python")
    return None
