"""Errors the builder raises."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable, List, Optional, Sequence, Union

if TYPE_CHECKING:
    from .compile.diagnostics import Diagnostic

__all__ = ["BuildError", "BuildTimeout", "ToolchainError", "UnsafeCacheDirError", "warn_broken", "cache_os_error"]


class BuildError(RuntimeError):
    """Compiling, linking or importing an operator failed.

    The message leads with the operator name and the compiler's first errors
    (file:line); ``log`` holds the whole output and ``log_path`` where it is kept.
    ``diagnostics`` lists the compiler's errors and warnings as ``opbuilder.Diagnostic``
    records at the user's lines (compile/diagnostics.py); empty when none were parsed.
    They are worked out when first read (g++ runs once more, for its JSON), so an error
    whose records nobody reads costs nothing more.
    """

    def __init__(self, message: str, *, name: str, log: str = "", log_path: Optional[str] = None,
                 diagnostics: Union[Sequence["Diagnostic"], Callable[[], Sequence["Diagnostic"]]] = ()) -> None:
        super().__init__(message)
        self.name = name
        self.log = log
        self.log_path = log_path
        self._diagnostics = diagnostics

    @property
    def diagnostics(self) -> List["Diagnostic"]:
        """The compiler's errors and warnings, each at the user's file and line (``opbuilder.Diagnostic``)."""
        if callable(self._diagnostics):
            self._diagnostics = list(self._diagnostics())
        elif not isinstance(self._diagnostics, list):
            self._diagnostics = list(self._diagnostics)
        return self._diagnostics

    @diagnostics.setter
    def diagnostics(self, value: Union[Sequence["Diagnostic"], Callable[[], Sequence["Diagnostic"]]]) -> None:
        self._diagnostics = value

    def _map_diagnostics(self, fn: Callable[["Diagnostic"], "Diagnostic"]) -> None:
        """Apply ``fn`` to each record, when they are worked out (load_inline: out of its generated file)."""
        before = self._diagnostics
        self._diagnostics = lambda: [fn(d) for d in (before() if callable(before) else before)]


class BuildTimeout(BuildError):
    """A build ran past the time it was given (``load_many(timeout=...)``); its compilers were killed.

    ``seconds`` is that time. The message says "timed out after N s"."""

    def __init__(self, message: str, *, name: str, seconds: float, log: str = "",
                 log_path: Optional[str] = None) -> None:
        super().__init__(message, name=name, log=log, log_path=log_path)
        self.seconds = seconds


class ToolchainError(BuildError, FileNotFoundError):
    """A tool the build needs is missing or does not work (``CXX=/bin/false``, no nvcc, no ninja).

    The message names the variable that chose the tool and its value. It is a
    ``FileNotFoundError`` too, as these errors were before it existed.
    """

    def __init__(self, message: str, *, name: str = "") -> None:
        super().__init__(message, name=name)


class UnsafeCacheDirError(PermissionError):
    """The cache directory could be written by another user, so nothing in it is trusted."""


_warned_broken: set = set()  # (path, why, then) said already in this process


def warn_broken(path: object, why: str, then: str) -> None:
    """Say (as a warning on the "opbuilder" logger) that a bookkeeping file is not what opbuilder
    writes there, and what is done instead: it is treated as absent, never trusted. Once per process for
    one path, cause and remedy (a load() may look an entry up twice: the store, then again to build)."""
    said = (str(path), why, then)
    if said in _warned_broken:
        return
    _warned_broken.add(said)
    import logging  # not on the warm path unless something is broken

    logging.getLogger("opbuilder").warning("opbuilder: %s is broken (%s); %s", path, why, then)


def cache_os_error(name: str, err: OSError, root: object) -> Optional[BuildError]:
    """A ``BuildError`` that says what to do about a file-system failure in the cache ``root`` (no
    write access, a full disk, a path too long), or None for other errors (raised as they are)."""
    import errno

    where = err.filename or root
    if err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        why = (f"no room to write {where} ({err.strerror}); nothing partial was kept. Free some space there "
               f"(python -m opbuilder cache clean removes old builds) or set OPBUILDER_CACHE_DIR to a file system "
               f"with room, and load again")
    elif err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        why = (f"cannot write {where} in the opbuilder cache {root} ({err.strerror}). Make it writable, or set "
               f"OPBUILDER_CACHE_DIR to a directory you can write to (builds already in a read-only cache still load)")
    elif err.errno == errno.ENAMETOOLONG:
        why = (f"cannot create {where} ({err.strerror}); set OPBUILDER_CACHE_DIR to a directory with a shorter "
               f"path that you can write to")
    elif err.errno == errno.ENOTDIR:
        why = (f"cannot create {where} ({err.strerror}: a part of that path is a file); set OPBUILDER_CACHE_DIR "
               f"to a directory you can write to")
    else:
        return None
    error = BuildError(f"building operator '{name}' failed: {why}", name=name)
    error.cache_problem = True  # its fix is the cache's, whatever else failed (cache/shipped.py built_instead)
    return error


class NoBuildError(BuildError):
    """``OPBUILDER_NO_BUILD=1`` (production) and an operator would have to be built: no shipped binary
    fits and none is in the cache. The message names the operator, why the shipped binary did not fit
    (``reason``), and the fix (docs/shipping.md)."""

    WHEEL_FIX = ("install a wheel of the package built for this Python and opbuilder (python -m opbuilder wheel "
                 "PKGDIR), or unset OPBUILDER_NO_BUILD to build it here")

    def __init__(self, name: str, reason: str, fix: str = WHEEL_FIX) -> None:
        setting = os.environ.get("OPBUILDER_NO_BUILD", "1")  # (as set: =yes says yes)
        super().__init__(f"operator '{name}' would have to be built, and OPBUILDER_NO_BUILD={setting} forbids "
                         f"building: {reason}. Fix: {fix}", name=name)
        self.reason = reason
