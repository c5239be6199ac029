"""A warm load() in one step: what the last full lookup of a build depended on, checked by stat stamps.

A full warm lookup (builder.py) reads the operator's sources and headers, hashes them, plans the
compile (toolchain facts, flags) and finds the build by its key: ~1 ms of work and ~10 ms of imports in a
new process. Once it has found a build in the cache, ``remember`` writes one record under its identity
in ``<op dir>/warm.rec`` (marshal data; ``MAX_RECORDS`` identities per operator): the key and the
library, and the stat stamp (size, mtime, ctime, inode, device; trust.stamp_of) of every file that
lookup depended on:

- each source, and each header the build's manifest lists (or that the file is still missing);
- the files behind every toolchain fact it used (probe_cache.py: the compiler, opbuilder's and
  nanobind's headers, Python's), noted as the lookup used them (``note_stamps``);
- each directory on PATH (a compiler put earlier on it would be found instead);
- opbuilder's own modules that ran the lookup (an edit or an upgrade of them may key builds otherwise);
- the libraries it loads first (nanobind's runtime, the core library) and the library itself.

The identity is everything else the lookup reads, as one string (``_identity``): the spec (name,
sources, options, cache), the environment variables it consults (``ENV_NAMES`` and every
``OPBUILDER_`` one), the interpreter, and where on ``sys.path`` nanobind and pybind11 are found. ``module`` (called by ``CustomOpBuilder.load()`` first) imports the build when every stamp
is unchanged: a few dozen ``stat`` calls, no hashing, no builder import. Anything else falls through to
the full lookup, which writes the record again.

Why a stamp may stand in for contents here: a stamp is recorded only if every file's last change
(``max(mtime, ctime)``) is ``SETTLE_NS`` older than the start of the lookup that hashed it, so the
contents hashed are the contents the stamp describes; any later write moves its ctime (which no user
can set back), so an edit, even one that keeps the size and restores the mtime, changes the stamp.
The record, the cache root and the directories above it, the op and build directories and the library
are trusted as trust.py trusts every cache file (ours, not a link, written by no one else), with its
tests written out here (``_ours``, ``_above_ok``; tests/test_load_path.py holds them to trust.py's), so a
warm load() does not import trust.py (~0.8 M instructions of a new process). Whatever fails them falls
through to the full lookup, which checks with trust.py and says what is wrong.

This module is ``opbuilder.warm``, outside the cache package, so that a warm load() imports no package of
opbuilder's but opbuilder itself (a package is a module to import: ~0.3 M instructions of a new process,
issue 38); ``opbuilder.cache.warm`` is this module under its old name. The load itself (``import_build``)
is spec.py's, imported with ``import opbuilder``: a warm load() imports this module and no other.
"""
from __future__ import annotations

import marshal
import os
import sys
import threading
from stat import S_ISDIR, S_ISLNK, S_ISREG, S_ISVTX, S_IWGRP, S_IWOTH
import time
from pathlib import Path
from types import ModuleType
from contextlib import contextmanager  # imported by numpy, and so by the runtime, already
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Sequence, Tuple

from .spec import DEP_FILES, NATIVE_DIR, import_build, is_key

__all__ = ["module", "batch", "trusted_as_given", "ENV_NAMES", "RECORDS"]

# a full lookup's ``remember`` writes the record (cache/warm_write.py, imported by the builder: not on this path)

RECORDS = "warm.rec"  # in the op dir: marshal data, (FORMAT, {identity: marshal data of its record})
FORMAT = "warm-3"  # each record stays bytes until its identity is asked for: one is decoded per load()
MAX_RECORDS = 16  # identities kept per operator (environments, caches); the oldest go first
USE_STAMP_S = 600  # as published.USE_STAMP_S: a build's last-used stamp is renewed once older than this
# the variables the full lookup reads besides OPBUILDER_* (tests/test_warm_record.py checks the list
# against every variable opbuilder reads); toolchain.COMPILER_ENV is among them
ENV_NAMES = ("CXX", "CC", "NVCC", "CUDAHOSTCXX", "CUDA_HOME", "CUDA_PATH", "PATH", "HOME", "PYTHONPATH",
             "TORCH_CUDA_ARCH_LIST", "CPATH", "CPLUS_INCLUDE_PATH", "C_INCLUDE_PATH", "OBJC_INCLUDE_PATH",
             "OBJCPLUS_INCLUDE_PATH", "GCC_EXEC_PREFIX", "COMPILER_PATH", "LIBRARY_PATH", "LD_RUN_PATH",
             "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN", "CCC_OVERRIDE_OPTIONS")
# OPBUILDER_ variables that change no lookup: a record made without them serves a process with them
# (the test suite's build guard sets its own per test)
_NOT_LOOKUP = frozenset(("OPBUILDER_NO_BUILD", "OPBUILDER_VERBOSE", "OPBUILDER_LOCK_TIMEOUT",
                         "OPBUILDER_TORCH_BRIDGE"))
_NOT_LOOKUP_PREFIX = "OPBUILDER_BUILD_GUARD"
_ENV_BYTES = frozenset(n.encode() for n in ENV_NAMES)
_PKG_DIR = os.path.dirname(os.path.abspath(__file__))  # opbuilder's own code
_OTHERS_WRITE = S_IWGRP | S_IWOTH
_OPEN = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)

if TYPE_CHECKING:  # a typing alias made at import costs every warm load() tens of microseconds
    Stamp = Optional[List[int]]


def _stamp_of(st: os.stat_result) -> list:
    """trust.stamp_of: size, mtime, ctime, inode, device."""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def _stamp(path: str) -> Stamp:
    """``stamp_of`` through links, or None if nothing is there (what the compiler's search skips too)."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]  # trust.stamp_of, inlined


# while a ``batch()`` is open (load_many), each path is stat'ed once: its items are loaded at one time,
# and share most of what they depend on (the toolchain's files: ~60 of an item's ~80 stamps)
_batch: Optional[Dict[str, Stamp]] = None
_batch_depth = 0
_batch_lock = threading.Lock()


@contextmanager
def batch() -> Iterator[None]:
    """``with batch():`` loads many operators at one time: a file is stat'ed once for all of them. A
    generator, not a class: a class is ~0.06 M instructions of every new process that imports this module."""
    global _batch, _batch_depth
    with _batch_lock:
        _batch_depth += 1
        if _batch is None:
            _batch = {}
    try:
        yield
    finally:
        with _batch_lock:
            _batch_depth -= 1
            if not _batch_depth:
                _batch = None


def _dependency_path(path: str, root: str) -> bool:
    """Whether ``path`` is where a library a module loads first can be, as importer.recorded allows it:
    opbuilder's installed runtime, or ``<root>/<dir>/<key>/<file>`` of one opbuilder builds in this cache
    (importer.DEP_FILES), so a record can make load() preload nothing else."""
    head, file = os.path.split(path)
    if head == NATIVE_DIR:
        return file in DEP_FILES.values()
    key_dir, key = os.path.split(head)
    top, name = os.path.split(key_dir)
    return top == root and DEP_FILES.get(name) == file and is_key(key)


def _ours(st: os.stat_result, want_dir: bool) -> bool:
    """trust._check's test of an entry (an lstat, or the fstat of a file opened without following a link):
    a directory (``want_dir``) or a regular file of ours that group and others cannot write."""
    mode = st.st_mode
    return (S_ISDIR(mode) if want_dir else S_ISREG(mode)) and st.st_uid == os.geteuid() and not mode & _OTHERS_WRITE


def _above_ok(st: os.stat_result, euid: int, egid: int) -> bool:
    """trust._check_above's test of a directory above the cache root (an lstat): not a link, root's or ours,
    and writable by no one else (by others or another group) unless sticky."""
    mode = st.st_mode
    if S_ISLNK(mode) or st.st_uid not in (0, euid):
        return False
    return not (mode & S_IWOTH or (mode & S_IWGRP and st.st_gid != egid)) or bool(mode & S_ISVTX)


def trusted_as_given(root: Path) -> bool:
    """Whether ``root`` (absolute, normal, no link on the way) passes trust.trusted_root as it is: a
    directory of ours only we can write, below directories no one else can write (load_inline asks it of
    its strings' directory, as this module asks it of the cache)."""
    path = os.fspath(root)
    if not path.startswith("/") or path.startswith("//") or os.path.normpath(path) != path:
        return False
    euid, egid = os.geteuid(), os.getegid()
    try:
        if not _ours(os.lstat(path), True):
            return False
        i = path.rfind("/")
        while i > 0:  # trust._above: each directory above, nearest first, then "/"
            if not _above_ok(os.lstat(path[:i]), euid, egid):
                return False
            i = path.rfind("/", 0, i)
        return _above_ok(os.lstat("/"), euid, egid)
    except OSError:
        return False


def _trusted_root(root: Path) -> Path:
    """trust.trusted_root(root, create=False): ``root`` itself when it passes as given (the usual case,
    no import of trust.py), else trust.py's answer (the real path behind links above it, or its error);
    once per batch (its items share the cache: ~8 lstats each)."""
    memo = _batch
    key = f"\0root {root}"  # no path starts with a NUL
    got = None if memo is None else memo.get(key)
    if got is None:
        if trusted_as_given(root):
            got = root  # type: ignore[assignment]
        else:
            from .cache.trust import trusted_root
            got = trusted_root(root, create=False)  # type: ignore[assignment]
        if memo is not None:
            memo[key] = got  # type: ignore[assignment]
    return got  # type: ignore[return-value]


def stamps_unchanged(stamps: Sequence[Sequence]) -> bool:
    """Whether each (path, stamp) still has that stamp (``_stamp(path) == stamp``; a path that cannot be
    stat'ed for another reason counts as changed), in one loop: a warm load() checks ~100
    (tools/probe_cache.py's records use it too)."""
    stat = os.stat  # _stamp, inlined
    for p, then in stamps:
        try:
            st = stat(p)
        except (FileNotFoundError, NotADirectoryError):
            if then is not None:
                return False
            continue
        except OSError:  # cannot tell (a permission): changed, so the full lookup decides
            return False
        if then != [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]:
            return False
    return True


def stamps_data(stamps: Sequence[Stamp]) -> bytes:
    """A record's input stamps as one string of bytes: each stamp's five numbers, or -1 for a file that
    is not there (a size is never negative), one list in marshal's version 2 (no references, so the same
    numbers always give the same bytes). A warm load() compares it with the data of the stamps it takes
    now (``_unchanged``) and decodes no number: decoding ~100 stamps, each a list of five numbers (two of
    them nanosecond times, decoded as longs), was ~0.3 M instructions of a new process (issue 38)."""
    flat: list = []
    for s in stamps:
        if s is None:
            flat.append(-1)
        else:
            flat += s
    return marshal.dumps(flat, 2)


def _unchanged(inputs: Sequence) -> bool:
    """Whether the files of a record's ``inputs`` (their paths joined by NULs, ``stamps_data`` of their
    stamps) still have those stamps (within a batch, each path stat'ed once); a path that cannot be
    stat'ed for another reason than its absence counts as changed (the full lookup decides)."""
    paths, then = inputs
    if type(paths) is not str or type(then) is not bytes:
        return False
    memo = _batch
    flat: list = []
    if memo is not None:
        for p in paths.split("\0"):
            now = memo.get(p, memo)
            if now is memo:
                now = memo[p] = _stamp(p)
            if now is None:
                flat.append(-1)
            else:
                flat += now
        return marshal.dumps(flat, 2) == then
    stat = os.stat  # _stamp, inlined: ~100 paths
    add = flat.append
    for p in paths.split("\0"):
        try:
            st = stat(p)
        except (FileNotFoundError, NotADirectoryError):
            add(-1)
            continue
        except OSError:
            return False
        add(st.st_size)
        add(st.st_mtime_ns)
        add(st.st_ctime_ns)
        add(st.st_ino)
        add(st.st_dev)
    return marshal.dumps(flat, 2) == then


def _identity(spec) -> str:
    """Everything besides files that decides the full lookup's result, as one string (the cache root as
    the caller gave it: its real path is checked on each use)."""
    memo = _batch
    context = None if memo is None else memo.get("")  # type: ignore[union-attr]
    if context is None:
        context = "\0".join([FORMAT, sys.version, sys.executable, _PKG_DIR, *_environment(),
                             *_found_on_path(("nanobind", "pybind11"))])
        if memo is not None:
            memo[""] = context  # type: ignore[assignment]  (one environment for a batch's items)
    parts = [context, spec.name, spec.backend, spec.kind, str(spec.debug), str(spec.root), str(spec.binding)]
    for group in (spec.sources, spec.include_paths, spec.cflags, spec.cuda_cflags, spec.ldflags):
        parts += [str(len(group)), *map(str, group)]  # each list with its length: no two specs read alike
    return "\0".join(parts)


def _read_by_lookup(name: str) -> bool:
    return (name.startswith("OPBUILDER_") and name not in _NOT_LOOKUP and not name.startswith(_NOT_LOOKUP_PREFIX)) \
        or name in ENV_NAMES


def _environment() -> List[str]:
    """``NAME=value`` of each variable the full lookup reads (``_read_by_lookup``), sorted by name. On POSIX
    from the bytes os.environ keeps (its ``_data``), decoding only those: iterating os.environ decodes
    every name in Python (~0.2 M instructions of a warm load, with ~100 variables set)."""
    env = os.environ
    data = getattr(env, "_data", None)
    if os.name != "posix" or not isinstance(data, dict):
        return [f"{k}={env[k]}" for k in sorted(k for k in env if _read_by_lookup(k))]
    out = []
    for k, v in sorted([kv for kv in data.items() if kv[0] in _ENV_BYTES or kv[0].startswith(b"OPBUILDER_")]):
        name = os.fsdecode(k)
        if _read_by_lookup(name):
            out.append(f"{name}={os.fsdecode(v)}")
    return out


_found: Dict[Tuple[str, ...], List[str]] = {}  # sys.path -> _found_on_path's answer, in this process


def _found_on_path(packages: Tuple[str, ...]) -> List[str]:
    """The first ``sys.path`` entry holding each of ``packages`` (whose headers and version the lookup
    uses, found there by toolchain._package_origin), not all of ``sys.path``: a script's own directory
    comes first on it, and a record per script would be written for the same build. Found once per
    ``sys.path`` in a process, as _package_origin finds them once."""
    key = (*packages, *sys.path)
    out = _found.get(key)
    if out is None:
        out = []
        for name in packages:
            where = "-"
            for e in sys.path:
                # os.path.isdir(e/name), as an access() of e/name/ (a file there is ENOTDIR): no stat_result
                # and no exception made for each entry without it (~0.25 M instructions of a warm load)
                if isinstance(e, str) and "\0" not in e and os.access(f"{e or '.'}/{name}/", os.F_OK):
                    where = os.path.abspath(e)
                    break
            out.append(f"{name}:{where}")
        _found[key] = out
    return out


def _records_path(root: Path, spec) -> str:
    """``<root>/<name>/warm.rec``: a module's op dir (spec.op_dir) holds its records, one per identity."""
    return f"{root}/{spec.name}/{RECORDS}"


def _read_file(path: str) -> Optional[bytes]:
    """trust.read_file(path) when it would read it (opened without following a link, a regular file of
    ours only we can write); else None."""
    try:
        fd = os.open(path, _OPEN)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not _ours(st, False):
            return None
        chunks = []
        want = st.st_size + 1
        while True:
            chunk = os.read(fd, want)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            want = 1 << 16
    except OSError:
        return None
    finally:
        os.close(fd)


def _read_records(path: str) -> dict:
    """The records in ``path``, each still marshal data, by identity (trusted like every cache file:
    ``_read_file``); {} if there are none or they are not what this opbuilder writes."""
    raw = _read_file(path)
    if raw is None:
        return {}
    try:
        data = marshal.loads(raw)
    except (ValueError, EOFError, TypeError):
        return {}
    if not isinstance(data, tuple) or len(data) != 2 or data[0] != FORMAT or not isinstance(data[1], dict):
        return {}
    return data[1]


def _record(path: str, identity: str) -> Optional[tuple]:
    """The record of ``identity`` in ``path``, decoded (only it: a file holds up to ``MAX_RECORDS``, each
    ~100 stamps); None if there is none, or it is not one."""
    data = _read_records(path).get(identity)
    if not isinstance(data, bytes):
        return None
    try:
        rec = marshal.loads(data)
    except (ValueError, EOFError, TypeError):
        return None
    return rec if isinstance(rec, tuple) and len(rec) == 5 else None


def module(spec) -> Optional[ModuleType]:
    """The module of ``spec``'s build when its warm record says nothing it depended on changed; else None
    (the caller runs the full lookup). Never raises for a record that does not fit."""
    if not spec.warm_record_fits():
        return None
    identity = _identity(spec)
    rec = _record(f"{spec.root}/{spec.name}/{RECORDS}", identity)
    if rec is None:
        return None  # the full lookup checks the root: each directory above it is lstat'ed once per load
    try:
        root = _trusted_root(spec.root)
        op_dir = f"{root}/{spec.name}"
        if not _ours(os.lstat(op_dir), True):  # plain strings: no Path per check
            return None
        if root != spec.root:  # links above the root: its real path, checked, is what is read from
            rec = _record(f"{op_dir}/{RECORDS}", identity)
            if rec is None:
                return None
        key, file, lib_stamp, inputs, preload_stamps = rec
        if not is_key(key) or "/" in file:
            return None
        if not _unchanged(inputs):
            return None
        key_dir = f"{op_dir}/{key}"
        dir_st = os.lstat(key_dir)
        lib = f"{key_dir}/{file}"
        st = os.lstat(lib)
        if not _ours(dir_st, True) or not _ours(st, False) or _stamp_of(st) != lib_stamp:
            return None
        preload_libs = []
        for p, then in preload_stamps:
            if not _dependency_path(p, str(root)):
                return None
            st = os.lstat(p)
            if not S_ISREG(st.st_mode) or _stamp_of(st) != then:
                return None
            preload_libs.append(p)  # strings: import_build takes them as paths
    except (OSError, ValueError, TypeError):
        return None
    if time.time() - dir_st.st_mtime > USE_STAMP_S:
        try:
            os.utime(key_dir)  # used: kept by pruning (published.py)
        except OSError:
            pass
    return import_build(spec.name, op_dir, key, lib, preload_libs)
