"""Which files a compile depends on: the headers it read, and the files whose creation would change it.

A depfile (``-MD``) lists every file a compile read. Not all of them are
tracked: headers under the toolchain's include directories (opbuilder's,
pybind11's, Python's: keyed by digest and version) and the compiler's own
search directories (libstdc++, libc: keyed by the compiler's identity) are
left out, unless a directory the user named (``include_paths``, ``-I``,
``-isystem``, ...) holds them more closely. So a header in a user
``-isystem`` directory is tracked, which ``-MMD`` would not list.

A header can also change a build without existing yet. ``#include "cfg.h"``
found in the second ``-I`` directory is another header once a ``cfg.h``
appears in the first one, or next to the file that includes it (include-path
shadowing); ``__has_include("opt.h")`` turns true once ``opt.h`` appears.
``absent_candidates`` lists those paths: for each tracked header, the same
relative name in every directory that may be searched before the one it was
found in, and for every ``__has_include`` with a literal name, that name in
each directory it may be looked up in. The builder records each missing one
(``fingerprint.ABSENT``), and a build whose missing file exists is stale, like one whose
header changed. The list over-approximates (the including file is not known,
so every directory of an included file counts), which costs at most a
rebuild; what it cannot see: a ``__has_include`` whose argument is a macro,
a name spelled with ``..`` found past the first directory, and new files in
the toolchain's or the compiler's own directories.

The link reads files too: a static archive or object in ``ldflags`` (given
by path, or ``-lNAME`` found as ``libNAME.a`` in an ``-L`` directory) is
copied into the library, so ``linked_archives`` names them and the builder
keys the build by their contents like a header's. Shared libraries are not:
the dynamic loader reads them when the module is imported.
"""
from __future__ import annotations

import os
import re
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from ..cache.relocate import clean_path

__all__ = ["SearchPath", "search_path", "tracked", "absent_candidates", "linked_archives", "quoted_and_bracket_dirs"]

_DIR_FLAGS = {"-I": "bracket", "-iquote": "quote", "-isystem": "bracket", "-idirafter": "after"}
_HAS_INCLUDE = re.compile(rb'__has_include(?:_next)?\s*\(\s*(?:"([^"\n]+)"|<([^>\n]+)>)\s*\)')


class SearchPath:
    """One compile's include directories, in the compiler's order, and what is not tracked.

    ``quote``: ``-iquote`` directories (searched for ``"..."`` after the including
    file's directory); ``bracket``: ``-I``, then ``-isystem``, then ``-idirafter``
    directories, as given; ``user``: the directories the user named, and the
    project root; ``untracked``: the toolchain's and the compiler's own directories.
    """

    __slots__ = ("quote", "bracket", "user", "untracked")

    def __init__(self, quote: Tuple[str, ...], bracket: Tuple[str, ...], user: Tuple[str, ...],
                 untracked: Tuple[str, ...]) -> None:
        self.quote, self.bracket, self.user, self.untracked = quote, bracket, user, untracked


def _dir_flags(flags: Sequence[str]) -> Iterable[Tuple[str, str]]:
    """(flag, directory) for each include-directory flag, joined (``-Idir``) or separate (``-I dir``)."""
    i = 0
    while i < len(flags):
        f = flags[i]
        for flag in _DIR_FLAGS:
            if f == flag and i + 1 < len(flags):
                yield flag, flags[i + 1]
                i += 1
                break
            if f.startswith(flag) and len(f) > len(flag) and not (flag == "-I" and f[2:3] == "-"):
                yield flag, f[len(flag):]
                break
        i += 1


def _dir_args(flags: Sequence[str]) -> Iterable[Tuple[str, str]]:
    """(kind, directory) for each include-directory flag (``_DIR_FLAGS``' kinds)."""
    return ((_DIR_FLAGS[flag], d) for flag, d in _dir_flags(flags))


def quoted_and_bracket_dirs(flags: Sequence[str]) -> List[Tuple[str, str]]:
    """(flag, directory) of the ``-iquote`` and ``-I`` directories in ``flags``: those searched before any
    ``-isystem`` one (opbuilder's own headers come first of those)."""
    return [(flag, d) for flag, d in _dir_flags(flags) if flag in ("-I", "-iquote")]


def search_path(flags: Sequence[str], user_flags: Sequence[str], cwd: str, project: str,
                untracked: Sequence[str]) -> SearchPath:
    """The search path of a compile run in ``cwd`` with ``flags`` (all of them, in order); ``user_flags``
    are the ones the user gave (include paths as ``-I``, cflags), ``untracked`` the toolchain's and
    compiler's directories."""
    def absolute(d: str) -> str:
        return clean_path(os.path.join(cwd, os.path.expanduser(d)))

    quote: List[str] = []
    bracket: Dict[str, List[str]] = {"bracket": [], "after": []}
    for kind, d in _dir_args(flags):
        (quote if kind == "quote" else bracket[kind]).append(absolute(d))
    user = [project] + [absolute(d) for _, d in _dir_args(user_flags)]
    drop = set()
    for d in untracked:
        drop.update((os.path.normpath(d), os.path.realpath(d)))
    return SearchPath(tuple(dict.fromkeys(quote)), tuple(dict.fromkeys(bracket["bracket"] + bracket["after"])),
                      tuple(dict.fromkeys(user)), tuple(sorted(drop)))


def _under(path: str, d: str) -> bool:
    return path.startswith(d.rstrip("/") + "/")


def _closest(path: str, dirs: Iterable[str]) -> int:
    """Length of the longest of ``dirs`` that holds ``path`` (-1 if none)."""
    return max((len(d.rstrip("/")) for d in dirs if _under(path, d)), default=-1)


def tracked(inputs: Sequence[str], search: SearchPath) -> List[str]:
    """The inputs (absolute, clean) whose contents the build is keyed by: all but those under an
    untracked directory that no user-named directory holds more closely."""
    return [p for p in inputs if _closest(p, search.untracked) < 0 or _closest(p, search.user) > _closest(p, search.untracked)]


def absent_candidates(source: str, headers: Sequence[str], search: SearchPath,
                      texts: Optional[Dict[str, bytes]] = None) -> List[str]:
    """Paths that, were they created, could change what a compile of ``source`` that read ``headers``
    (tracked, absolute) finds (see the module's docstring); existing ones included, the caller checks.
    ``texts``: the files' contents where already read (else they are read here)."""
    includers = tuple(dict.fromkeys(os.path.dirname(p) for p in (source, *headers)))
    quote, bracket = search.quote, search.bracket
    out: Dict[str, None] = {}

    def add(d: str, name: str) -> None:
        p = clean_path(os.path.join(d, name)) if ".." in name.split("/") else os.path.join(d, name)
        if _closest(p, search.untracked) < 0 and p not in out:
            out[p] = None

    for h in headers:
        for d in dict.fromkeys(includers + quote + bracket):
            if not _under(h, d):
                continue
            name = h[len(d.rstrip("/")) + 1:]
            earlier: Tuple[str, ...] = ()
            if d in bracket:
                earlier = includers + quote + bracket[:bracket.index(d)]
            elif d in quote:
                earlier = includers + quote[:quote.index(d)]
            for e in earlier:
                if e != d:
                    add(e, name)
    for f in (source, *headers):
        text = (texts or {}).get(f)
        if text is None:
            try:
                with open(f, "rb") as fh:
                    text = fh.read()
            except OSError:
                continue
        if b"__has_include" not in text:
            continue
        for m in _HAS_INCLUDE.finditer(text):
            quoted, angled = m.group(1), m.group(2)
            name = (quoted or angled).decode(errors="replace").strip()
            if os.path.isabs(name):
                add("/", name.lstrip("/"))
                continue
            for d in ((os.path.dirname(f),) + quote if quoted else ()) + bracket:
                add(d, name)
    for h in (source, *headers):
        out.pop(h, None)
    return list(out)


_STATIC = (".a", ".o", ".lo")


def linked_archives(ldflags: Sequence[str], cwd: str) -> List[str]:
    """The static archives and objects a link with ``ldflags`` (run in ``cwd``) copies code from: those
    named by path, and ``-lNAME`` / ``-l:FILE`` as the first ``-L`` directory that has the library
    holds it (``libNAME.a``; tracked also when a ``libNAME.so`` beside it is the one linked, which costs at
    most a rebuild). Libraries in no ``-L`` directory (the system's) are not named: the compiler's identity
    keys its own."""
    dirs: List[str] = []
    out: Dict[str, None] = {}
    flags = list(ldflags)
    i = 0
    while i < len(flags):
        f = flags[i]
        if f in ("-L", "-l") and i + 1 < len(flags):
            f, i = f + flags[i + 1], i + 1
        if f.startswith("-L"):
            dirs.append(clean_path(os.path.join(cwd, os.path.expanduser(f[2:]))))
        elif f.startswith("-l"):
            names = [f[3:]] if f.startswith("-l:") else [f"lib{f[2:]}.a", f"lib{f[2:]}.so"]
            for d in dirs:
                found = [os.path.join(d, n) for n in names if os.path.isfile(os.path.join(d, n))]
                if found:
                    out.update((p, None) for p in found if p.endswith(_STATIC))
                    break
        elif not f.startswith("-") and f.endswith(_STATIC):
            out[clean_path(os.path.join(cwd, os.path.expanduser(f)))] = None
        i += 1
    return list(out)
