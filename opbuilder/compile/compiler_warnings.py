"""The compiler warnings of a successful build that are about the user's own files.

A warning is the user's unless its file lies in a directory that is not
theirs: opbuilder's and pybind11's headers, Python's, the compiler's own
(libstdc++, libc) and the cache (the generated headers). After a compile the
builder writes one line to stderr, ``opbuilder: NAME: 2 compiler warnings in
my_op.cpp (verbose=True shows them)``, or, verbose, the warnings themselves.
Only a compile shows them: a warm load compiles nothing and says nothing
(the full output stays in the build's ``build.log``).
"""
from __future__ import annotations

import os
import re
import sys
from typing import List, Sequence, Tuple

__all__ = ["user_warnings", "report"]

_WARNING_RE = re.compile(r"^(?P<file>[^\s:][^:]*):\d+(?::\d+)?:\s*warning:")
_CONTEXT_RE = re.compile(r"^(?:In file included from |\s+from )|^[^\s:][^:]*: In |^[^\s:][^:]*:\d+(?::\d+)?:\s+"
                         r"(?:required|in )")
_NOTE_RE = re.compile(r"^[^\s:][^:]*:(?:\d+(?::\d+)?:)?\s*note:")


def _under(path: str, dirs: Sequence[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


def user_warnings(output: str, build_dir: str, not_users: Sequence[str]) -> List[Tuple[str, str]]:
    """(file, full text) of each warning in the compiler ``output`` whose file is not under
    ``not_users`` (relative paths are relative to ``build_dir``, where the compiler ran). The text
    is the warning with the context gcc and clang print before it (``In function ...``,
    ``In instantiation of ...``) and the source excerpt and notes after it."""
    dirs = [os.path.realpath(d) for d in not_users]
    found: List[Tuple[str, str]] = []
    context: List[str] = []
    current: List[str] = []
    keep = False

    def close() -> None:
        nonlocal current
        if current and keep:
            found.append((file, "\n".join(current)))
        current = []

    file = ""
    for line in output.splitlines():
        m = _WARNING_RE.match(line)
        if m:
            close()
            file = m.group("file")
            path = os.path.realpath(os.path.join(build_dir, file))
            keep = not _under(path, dirs)
            current = context + [line]
            context = []
        elif current and (line.startswith(" ") or _NOTE_RE.match(line)):
            current.append(line)
        else:
            close()
            context = context + [line] if _CONTEXT_RE.match(line) else []
    close()
    return found


def report(name: str, warnings: List[Tuple[str, str]], verbose: bool) -> None:
    """One line on stderr saying how many warnings and where; with ``verbose``, the warnings too."""
    if not warnings:
        return
    files = ", ".join(dict.fromkeys(os.path.basename(f) for f, _ in warnings))
    n = len(warnings)
    head = f"opbuilder: {name}: {n} compiler warning{'s' if n != 1 else ''} in {files}"
    if verbose:
        sys.stderr.write(head + ":\n" + "\n".join(text for _, text in warnings) + "\n")
    else:
        sys.stderr.write(head + " (verbose=True shows them)\n")
    sys.stderr.flush()
