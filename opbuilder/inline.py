"""``load_inline``: build an operator module from C++ (and CUDA) source strings.

The strings are written, verbatim, into the cache under a directory named by
their content hash (so the same strings never rebuild, and edited strings get
a new build), then built by ``CustomOpBuilder`` like any other sources. The
user's C++ is its own file, ``cpp_sources.cpp``, included by a generated main
file, so a compiler error names ``cpp_sources.cpp`` and the line in the user's
string. ``functions`` generates the binding block for plain functions.
``Inline`` describes the same build without running it (for ``load_many``).
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from . import BUILDER_KEYWORDS, CustomOpBuilder
from .spec import cache_root
from .warm import trusted_as_given

# SHA-512 for the strings' key, from the module ``random`` takes it from: numpy and the runtime import it
# already, so a warm load_inline imports no hash module (_blake2 is ~0.45 M instructions of a new process;
# hashlib loads OpenSSL: ~5 ms). The same digest on every Python: _sha2 (3.12+) or _sha512 (3.11), chosen
# by the version: an import that fails searches all of sys.path first (~0.4 M instructions on 3.11)
try:
    if sys.version_info >= (3, 12):
        from _sha2 import sha512
    else:
        from _sha512 import sha512
except ImportError:  # pragma: no cover - an interpreter without the builtin module
    from hashlib import sha512

if TYPE_CHECKING:  # a typing alias made at import costs a new process tens of microseconds
    Sources = Union[str, Sequence[str]]

__all__ = ["load_inline", "Inline"]
_USER_CPP, _USER_CUDA = "cpp_sources.cpp", "cuda_sources.cu"
NANOBIND = "nanobind"  # compile/binding.py's name for it (imported only to read a source that names one)
# what each of binding.py's patterns starts with: a source with none of them (and no line ending in a
# backslash, which could join one) names no binding, and needs no scan (its module imports re: ~1 ms)
_BINDING_WORDS = ("MODULE", "nanobind", "pybind11", "ms_extension")


def _joined(who: str, what: str, src: Optional[Sources]) -> str:
    if src is None:
        return ""
    if isinstance(src, str):
        return src
    parts = list(src) if hasattr(src, "__iter__") and not isinstance(src, bytes) else None
    if parts is not None and all(isinstance(s, str) for s in parts):
        return "\n".join(parts)
    raise TypeError(f"{who}: {what} must be a string or a list of strings")


def _functions(name: str, functions: Union[None, Sequence[str], Dict[str, str]]) -> Dict[str, str]:
    if functions is None:
        return {}
    if isinstance(functions, str):
        functions = [functions]
    items = functions.items() if isinstance(functions, dict) else ((f, "") for f in functions)
    out = {}
    for fn, doc in items:
        if not isinstance(fn, str) or not fn.isidentifier():
            raise ValueError(f"load_inline({name!r}): functions must name C++ functions, got {fn!r}")
        if not isinstance(doc, str):
            raise TypeError(f"load_inline({name!r}): the docstring for {fn!r} must be a string, "
                            f"got {type(doc).__name__}")
        bad = next((c for c in doc if c == "\0" or "\ud800" <= c <= "\udfff"), None)
        if bad is not None:  # a C string ends at NUL; a lone surrogate has no UTF-8
            raise ValueError(f"load_inline({name!r}): the docstring for {fn!r} holds {bad!r}, which a C++ "
                             f"docstring cannot carry; remove it")
        out[fn] = doc
    return out


def _binding_of(cpp: str) -> Optional[str]:
    """compile/binding.binding_of_text(cpp), without importing it for a source that names no binding."""
    if not any(w in cpp for w in _BINDING_WORDS) and not any(
            line.rstrip(" \t\r").endswith("\\") for line in cpp.split("\n") if "\\" in line):
        return None
    from .compile.binding import binding_of_text
    return binding_of_text(cpp)


def _key(name: str, cpp: str, cuda: str, funcs: Dict[str, str]) -> str:
    """The strings' directory name: SHA-512 of every part, each with its length (no two part lists give
    the same bytes), its first 96 bits in hex."""
    h = sha512()
    for part in (name, cpp, cuda, *(x for kv in funcs.items() for x in kv)):
        data = part.encode("utf-8", "surrogatepass")
        h.update(b"%d:" % len(data))
        h.update(data)
    return h.hexdigest()[:24]


_ESCAPES = {"\\": "\\\\", '"': '\\"', "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _literal(text: str) -> str:
    """``text`` as a C++ string literal in ASCII: C escapes, and universal character names (``\\uXXXX``,
    ``\\UXXXXXXXX`` beyond the BMP: a surrogate pair, as JSON writes one, is no character in C++) for the
    rest, which the compiler writes as UTF-8. ``text`` holds no NUL and no lone surrogate (_functions)."""
    out = []
    for c in text:
        if c in _ESCAPES:
            out.append(_ESCAPES[c])
        elif " " <= c <= "~":
            out.append(c)
        else:
            n = ord(c)
            out.append("\\U%08x" % n if n > 0xFFFF else "\\u%04x" % n)
    return '"' + "".join(out) + '"'


# a namespace is allowed only outside functions and classes: after a user's code that leaves a '{' open,
# the compiler's first error is here, line _END_LINE of the generated main file, and load_built says why
_END_CHECK = "namespace opbuilder_inline_end {}"
_END_LINE = 4
_UNCLOSED = "cpp_sources ends inside a block: a '{' it opens is not closed, so what follows it is inside that block"


def _main_source(key: str, funcs: Dict[str, str], binding: str) -> str:
    lines = [f"// generated by opbuilder.load_inline (sources {key}); the user's code is {_USER_CPP}",
             '#include "opbuilder/extension.h"', f'#include "{_USER_CPP}"',
             _END_CHECK]  # line 4: an error here says the user's code left a block open (load_built)
    if funcs:
        lines.append("OB_MODULE(m) {" if binding == NANOBIND else "PYBIND11_MODULE(OB_EXTENSION_NAME, m) {")
        lines += [f"  m.def({_literal(f)}, &{f}, {_literal(doc)});" for f, doc in funcs.items()]
        lines.append("}")
    return "\n".join(lines) + "\n"


def _write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (UTF-8: what the compilers read, whatever the locale says) unless it is
    already there, atomically (concurrent callers agree). Compared as bytes: no text decoder is made."""
    data = text.encode("utf-8")
    try:  # os.read, not open(): no buffered reader is made (a warm load_inline reads two files)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if os.read(fd, len(data) + 1) == data:
                return
        finally:
            os.close(fd)
    except OSError:
        pass
    import tempfile  # only when writing: a warm load imports nothing it does not need

    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _described(who: str, name: object, cpp_sources: Sources, functions: Union[None, Sequence[str], Dict[str, str]],
               cuda_sources: Optional[Sources]) -> Tuple[str, str, Dict[str, str]]:
    """The checked arguments of a ``load_inline`` build: (C++ text, CUDA text, functions)."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"{who}: name must be a Python identifier, got {name!r}")
    cpp = _joined(f"{who}({name!r})", "cpp_sources", cpp_sources)
    cuda = _joined(f"{who}({name!r})", "cuda_sources", cuda_sources)
    return cpp, cuda, _functions(name, functions)


def _check_options(who: str, options: Dict[str, Any], name: str = "", cuda: str = "") -> None:
    """Errors for a keyword CustomOpBuilder does not take (torch's ``extra_cflags``), a name it would refuse
    (a keyword, non-ASCII, too long), an unknown backend or binding, flags that are not strings: before
    anything is written. ``Inline`` would only have failed later, inside load_many, naming CustomOpBuilder."""
    from .spec import check_backend, check_flags, check_name

    unknown = sorted(set(options) - set(BUILDER_KEYWORDS))
    if unknown:
        raise TypeError(f"{who} got unexpected keyword argument(s) {', '.join(unknown)}; accepted: name, "
                        f"cpp_sources, functions, cuda_sources, and CustomOpBuilder's {', '.join(BUILDER_KEYWORDS)}")
    check_name(name)
    check_backend(options.get("backend", "GPU" if cuda else "CPU"), options.get("binding"))
    check_flags(options)
    if "cuda_arch" in options:  # an architecture nvcc cannot take
        from .tools.cuda_arch import option_flags
        option_flags(options["cuda_arch"], None)


def _builder(name: str, cpp: str, cuda: str, funcs: Dict[str, str], builder_options: Dict[str, Any]
             ) -> CustomOpBuilder:
    """The ``CustomOpBuilder`` of checked inline sources, with their files written into the cache."""
    builder_options = dict(builder_options)
    key = _key(name, cpp, cuda, funcs)
    directory = cache_root(builder_options.get("build_dir")) / "inline" / name / key
    if not trusted_as_given(directory):  # there and trusted as it is (a warm load): trust.py not imported
        from .cache.trust import trusted_root
        try:
            directory = trusted_root(directory)  # created, or its real path behind links, or refused
        except OSError as e:
            raise _root_problem(name, cache_root(builder_options.get("build_dir")), e) from e
    _write(directory / _USER_CPP, cpp)
    sources = [directory / f"{name}.cpp"]
    # the user's code is #included, so the builder cannot read its binding: say it. nanobind (fast
    # builds) unless the code is written for pybind11 (its module macro or headers)
    binding = builder_options.setdefault("binding", _binding_of(cpp) or NANOBIND)
    _write(sources[0], _main_source(key, funcs, binding))
    if cuda:
        _write(directory / _USER_CUDA, cuda)
        sources.append(directory / _USER_CUDA)
        builder_options.setdefault("backend", "GPU")
    return CustomOpBuilder(name, [str(s) for s in sources], **builder_options)


def _root_problem(name: str, root: Path, err: OSError) -> BaseException:
    """The error load() gives for the cache ``root`` (a file, a directory others can write, one that
    cannot be created) when the inline sources' directory under it cannot be made (``err``)."""
    from .builder import root_error
    from .cache.trust import trusted_root
    from .errors import UnsafeCacheDirError

    if not isinstance(err, UnsafeCacheDirError):
        try:
            trusted_root(root)  # the root's own refusal first, in load()'s words
        except UnsafeCacheDirError as e:
            return e
        except OSError as e:
            err = e
    return root_error(name, root, err)


def load_written(make: Callable[[], CustomOpBuilder], builder: Optional[CustomOpBuilder] = None) -> ModuleType:
    """``load_built`` of ``make()`` (or of ``builder``, made by it already); if the sources it wrote into the
    cache are gone when it builds (``cache clean`` removed ``inline/`` between writing and building), they
    are written again and it loads once more."""
    builder = make() if builder is None else builder
    try:
        return load_built(builder)
    except (OSError, RuntimeError):  # FileNotFoundError, or a BuildError (a missing #include of them)
        if all(os.path.exists(s) for s in _written(builder)):
            raise
    return load_built(make())


def _written(builder: CustomOpBuilder) -> List[str]:
    """The files ``_builder`` wrote for ``builder``: its sources and the user's C++ file they include."""
    sources = [str(s) for s in builder.spec.sources]
    return sources + [os.path.join(os.path.dirname(sources[0]), _USER_CPP)]


def load_built(builder: CustomOpBuilder) -> ModuleType:
    """``builder.load()``, with the diagnostics of a failed build moved out of the generated main file:
    its lines are the binding of ``functions`` (no line of the user's), so they name the user's C++
    file with no line."""
    try:
        return builder.load()
    except RuntimeError as e:  # a BuildError (errors.py, imported only when one is raised)
        from .errors import BuildError
        if not isinstance(e, BuildError):
            raise
        main = os.path.realpath(builder.spec.sources[0])
        user = os.path.join(os.path.dirname(main), _USER_CPP)
        def mapped(d):
            if os.path.realpath(d.file) != main:
                return d
            if d.line == _END_LINE or "at end of input" in d.message:  # (a namespace left open: its end)
                return d._replace(file=user, line=None, column=None, message=_UNCLOSED)
            return d._replace(file=user, line=None, column=None)

        e._map_diagnostics(mapped)
        text = e.args[0] if e.args and isinstance(e.args[0], str) else ""
        base = os.path.basename(main)
        if f"{base}:{_END_LINE}:" in text or re.search(rf"{re.escape(base)}:\d+:\d+: error: expected .}}. at end of "
                                                      rf"input", text):  # said first, before the compiler's words
            head, sep, rest = text.partition("\n")
            e.args = (f"{head} {_UNCLOSED}{sep}{rest}",) + e.args[1:]
        raise


def load_inline(name: str, cpp_sources: Sources, functions: Union[None, Sequence[str], Dict[str, str]] = None,
                cuda_sources: Optional[Sources] = None, **builder_options) -> ModuleType:
    """Build and load a module from source strings.

    ``functions`` (names, or name -> docstring) binds those plain C++ functions (with nanobind,
    or with pybind11 when ``cpp_sources`` includes its headers); without it, ``cpp_sources`` holds
    its own ``OB_MODULE(m)`` (or ``PYBIND11_MODULE(OB_EXTENSION_NAME, m)``) block. With
    ``cuda_sources`` the backend defaults to ``"GPU"`` (declare the CUDA functions in
    ``cpp_sources``). ``builder_options`` go to ``CustomOpBuilder`` (``cuda_arch="8.0"`` compiles
    the CUDA sources with no GPU). A failed build's ``BuildError.diagnostics`` point at lines of the
    strings: ``file`` is the file each string was written to, verbatim (``cpp_sources.cpp``,
    ``cuda_sources.cu``; a list of strings is joined with newlines).
    """
    cpp, cuda, funcs = _described("load_inline", name, cpp_sources, functions, cuda_sources)
    _check_options("load_inline", builder_options, name, cuda)
    return load_written(lambda: _builder(name, cpp, cuda, funcs, builder_options))


class Inline:
    """A ``load_inline`` build described, not run: ``load_many([Inline(...), ...])`` builds many at once.

    The arguments are ``load_inline``'s, checked now (a bad name or source type raises here, not in
    ``load_many``); nothing is written or compiled until ``load()`` (or ``load_many``). Two equal
    ``Inline`` items (same name, sources, functions and options) are one build."""

    __slots__ = ("name", "cpp_sources", "cuda_sources", "functions", "options", "_key")

    def __init__(self, name: str, cpp_sources: Sources, functions: Union[None, Sequence[str], Dict[str, str]] = None,
                 cuda_sources: Optional[Sources] = None, **options: Any) -> None:
        cpp, cuda, funcs = _described("Inline", name, cpp_sources, functions, cuda_sources)
        _check_options("Inline", options, name, cuda)
        self.name, self.cpp_sources, self.cuda_sources, self.functions = name, cpp, cuda, funcs
        self.options = dict(options)
        self._key = (name, cpp, cuda, tuple(funcs.items()), repr(sorted(self.options.items())))

    def builder(self) -> CustomOpBuilder:
        """The ``CustomOpBuilder`` of this build, its source files written into the cache."""
        return _builder(self.name, self.cpp_sources, self.cuda_sources, self.functions, self.options)

    def load(self) -> ModuleType:
        """``load_inline`` with these arguments: build if needed, and import."""
        return load_written(self.builder)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Inline) and other._key == self._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        return f"Inline({self.name!r}, <{len(self.cpp_sources)} chars of C++>" + (
            f", <{len(self.cuda_sources)} chars of CUDA>" if self.cuda_sources else "") + ")"
