"""The ABI a nanobind operator, nanobind's runtime and the core library are built for.

Two parts decide whether binaries built apart can be loaded together:

- the Python API: on Python >= 3.12 opbuilder builds every nanobind library against the limited API
  (``Py_LIMITED_API=0x030C0000``, nanobind's stable ABI), so one binary serves 3.12, 3.13 and later;
  on 3.11 (nanobind has no stable ABI before 3.12) against this interpreter's full API;
- the C++ ABI the compiler's standard library gives: libstdc++ with the C++11 string ABI or the old
  one, or libc++. g++ 12 and g++ 13, or g++ and clang++ on libstdc++, give the same one.

They, not the compiler's path, key the core library's symbols (``core_tag``) and opbuilder's installed
runtime (installed.py), so a different compiler reuses what it can soundly link against.
``OPBUILDER_LIMITED_API=0`` builds for the full API on >= 3.12 too (one process cannot mix both).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Tuple

# defined in importer.py, which a shipped load() imports (and not this module)
from ..importer import LIMITED_API_HEX, limited_api, python_api

if TYPE_CHECKING:  # the toolchain module is imported when used: a shipped load() asks python_api() only
    from ..tools.toolchain import Compiler

__all__ = ["LIMITED_API_HEX", "limited_api", "api_flags", "python_api", "module_suffix", "cxx_abi", "wheel_tag"]


def api_flags() -> Tuple[str, ...]:
    """The compile flags of the Python API nanobind libraries are built against."""
    return (f"-DPy_LIMITED_API={LIMITED_API_HEX}",) if limited_api() else ()


def module_suffix() -> str:
    """The file suffix of a nanobind module built here: ``.abi3.so`` under the limited API."""
    if limited_api():
        return ".abi3.so"
    from ..tools.toolchain import ext_suffix
    return ext_suffix()


def wheel_tag() -> str:
    """The wheel tag of binaries built here: ``cp312-abi3-<platform>`` or ``cp311-cp311-<platform>``."""
    import sysconfig
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    if limited_api():
        return f"cp312-abi3-{plat}"
    py = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    return f"{py}-{py}-{plat}"


_PROBE = "#include <cstddef>\n"  # pulls in the C++ library's configuration header, defines nothing else


def cxx_abi(cxx: Compiler, state_dir: Optional[Path]) -> str:
    """The C++ library ABI ``cxx`` compiles for, probed once per compiler (its predefined macros after
    ``<cstddef>``): ``libstdc++ cxx11-abi=1``, ``libstdc++ cxx11-abi=0``, ``libc++ <version>``, with
    the target machine."""
    from ..tools.probe_cache import remembered

    def probe():
        import subprocess
        out = subprocess.run([*cxx.argv, "-x", "c++", "-std=c++17", "-dM", "-E", "-"], input=_PROBE,
                             capture_output=True, text=True, timeout=60)
        macros = dict(ln.split(" ", 2)[1:] if ln.count(" ") >= 2 else (ln, "") for ln in out.stdout.splitlines()
                      if ln.startswith("#define "))
        if "_LIBCPP_VERSION" in macros:
            lib = f"libc++ {macros['_LIBCPP_VERSION']}"
        elif "_GLIBCXX_USE_CXX11_ABI" in macros:
            lib = f"libstdc++ cxx11-abi={macros['_GLIBCXX_USE_CXX11_ABI']}"
        else:
            lib = f"unknown ({cxx.family} {cxx.version})"  # matches nothing built by another compiler
        import sysconfig
        return {"abi": f"{lib} {sysconfig.get_platform()}"}, [cxx.path]

    return str(remembered(state_dir, f"cxx abi {cxx.identity}", probe, inputs=[cxx.path], schema={"abi": str})["abi"])
