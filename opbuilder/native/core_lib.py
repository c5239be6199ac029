"""The core library: opbuilder's non-template C++ core, compiled once for every nanobind operator.

Most of what an operator used to compile was the same in every operator: the runtime bridge,
the recorded node, RecordOutputs, the fingerprints, error translation (the functions marked
``OB_CORE_FN`` in include/opbuilder, their bodies in src/core/). A nanobind operator only declares
them (it is built with ``-DOB_CORE_TAG=<tag>``, see include/opbuilder/detail/core_lib.h) and this
library, built from src/core/core_lib.cpp, defines them. It is built through the same pipeline as an
operator (keyed, locked, verified, published atomically; ``_obcore.lib`` in the cache, listed by
``cache list``, carried by ``build --into`` stores and bundles, like nanobind's runtime) and loaded
with RTLD_GLOBAL before the operator is imported.

The tag is a digest of opbuilder's headers and core sources, the C++ library ABI the compiler gives
and the Python API (native/abi.py: not the compiler's path, so another g++ of that ABI binds to the same
core, opbuilder's installed one included), and it is part of every exported symbol's name (an ``abi_tag``): an operator built from other
headers needs, and binds to, the core library built from those, so two versions loaded in one process never mix.
Builds that must see every function (pybind11 operators, sanitizer builds, CUDA sources, flags that
change the C++ library's ABI) keep compiling them inline, as before.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, Sequence

# its cache directory (_obcore.lib), its file, and how it is loaded are in importer.py, which a warm or
# shipped load() imports (and not this module)
from ..importer import CORE_FILE, CORE_NAME, dlopen_global
from ..importer import preload_core as preload

if TYPE_CHECKING:  # imported when used: a shipped load() reads constants and loads libraries only
    from ..spec import BuildSpec

__all__ = ["CORE_NAME", "CORE_FILE", "core_tag", "core_spec", "uses_core", "compiler_view", "layout_flag_error",
           "check_layout_flags", "preload", "dlopen_global"]

# user flags after which the operator must compile the core itself: instrumented code, another
# C++ library ABI (debug containers, the old string ABI, libc++), no exceptions or RTTI, or asked for
_INLINE_FLAGS = ("-fsanitize", "-D_GLIBCXX", "-U_GLIBCXX", "-D_LIBCPP", "-stdlib=", "-fno-exceptions",
                 "-fno-rtti", "-DOB_CORE_INLINE")
# user flags that change the layout of structs or the calling convention of everything compiled: no
# build of the core (inline or not) can help, the binding library's runtime and Python are compiled without
_LAYOUT_FLAGS = ("-fpack-struct", "-fshort-enums", "-fshort-wchar", "-mlong-double-", "-m96bit-long-double",
                 "-m32", "-mx32", "-m16", "-mabi=", "-fpcc-struct-return", "-freg-struct-return")
_LAYOUT_DEFAULTS = ("-mabi=sysv", "-mabi=lp64", "-mlong-double-80")  # what x86-64 Linux code is built with anyway


def core_tag(headers: str, cxx_abi: str, python_api: str) -> str:
    """The tag of the core built from headers of digest ``headers`` (headers.headers_digest) for the C++
    library ABI ``cxx_abi`` and the Python API ``python_api`` (abi.py; a C++ identifier: it names the symbols)."""
    from ..cache.fingerprint import digest_of
    return "obcore_" + digest_of([headers, cxx_abi, python_api])[:16]


def uses_core(spec: BuildSpec) -> bool:
    """Whether a nanobind operator ``spec`` links to the core library: CPU C++ sources built with
    flags that keep the C++ ABI and no instrumentation; otherwise it compiles the core inline. (A
    source that defines such a macro itself compiles the core inline too: detail/core_lib.h.)"""
    return spec.backend == "CPU" and not _inline_flags(spec.cflags)


def _inline_flags(flags: Sequence[str]) -> bool:
    return any(f.startswith(_INLINE_FLAGS) for f in compiler_view(flags))


def compiler_view(flags: Sequence[str]) -> List[str]:
    """``flags`` as the compiler proper and its preprocessor get them, each option in one piece:
    ``-Wp,a,b`` and ``-Xpreprocessor a`` (``-Xcompiler a,b`` of nvcc) unwrapped, ``-D X``, ``-U X`` and
    ``--define-macro[=]X`` joined as ``-DX``, ``-UX``, so that a check by prefix sees every spelling."""
    flat: List[str] = []
    i = 0
    while i < len(flags):
        f = flags[i]
        if f in ("-Xpreprocessor", "-Xcompiler", "--compiler-options") and i + 1 < len(flags):
            flat += flags[i + 1].split(",") if f != "-Xpreprocessor" else [flags[i + 1]]
            i += 2
            continue
        if f.startswith(("-Wp,", "-Xcompiler=", "--compiler-options=")):
            flat += f.split(",", 1)[1].split(",") if f.startswith("-Wp,") else f.split("=", 1)[1].split(",")
        else:
            flat.append(f)
        i += 1
    out: List[str] = []
    i = 0
    while i < len(flat):
        f = flat[i]
        for long, short in (("--define-macro", "-D"), ("--undefine-macro", "-U")):
            if f.startswith(long + "="):
                f = short + f[len(long) + 1:]
            elif f == long:
                f = short
        if f in ("-D", "-U") and i + 1 < len(flat):
            out.append(f + flat[i + 1])
            i += 2
            continue
        out.append(f)
        i += 1
    return out


def layout_flag_error(name: str, flags: Sequence[str], what: str = "cflags") -> Optional[str]:
    """Why operator ``name`` cannot be built with ``flags`` (its ``what``): a flag that changes how every
    struct is laid out or every function is called. Such a flag reaches the headers of opbuilder,
    nanobind or pybind11, Python and the C++ library, whose compiled parts (the core library,
    libnanobind, libpython, libstdc++) were built without it, so the operator would read their data
    wrongly: wrong numbers, std::bad_alloc, crashes. None when there is none."""
    for f in compiler_view(flags):
        if f.startswith(_LAYOUT_FLAGS) and not f.startswith(_LAYOUT_DEFAULTS):
            return (f"operator '{name}' cannot be built with {f!r} in {what}: it changes how every struct and "
                    f"function the sources see is laid out or called, including those of opbuilder, the "
                    f"binding library, Python and the C++ library, which are compiled without it, so the "
                    f"operator would read their data wrongly (wrong values, std::bad_alloc, crashes); apply "
                    f"it to your own types only (#pragma pack(push, 1) ... #pragma pack(pop), or "
                    f"__attribute__((packed)) on a struct), or remove it")
    return None


def check_layout_flags(spec: BuildSpec) -> None:
    """ValueError for a flag of ``spec`` that changes the layout of every struct (``-fpack-struct``...):
    no build of the operator can then read the data of what it links to (``layout_flag_error``)."""
    for flags, what in ((spec.cflags, "cflags"), (spec.cuda_cflags, "cuda_cflags")):
        why = layout_flag_error(spec.name, flags, what)
        if why is not None:
            raise ValueError(why)


def core_spec(root: Path, verbose: bool = False) -> BuildSpec:
    """The build of the core library from the installed headers and sources, in the cache ``root``."""
    from ..spec import BuildSpec
    from .headers import source_dir
    return BuildSpec(name=CORE_NAME, sources=(source_dir() / "core" / "core_lib.cpp",), backend="CPU",
                     kind="core", include_paths=(), cflags=(), cuda_cflags=(), ldflags=(), debug=False,
                     verbose=verbose, root=root)
