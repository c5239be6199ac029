"""Trusting what is in the cache directory: nothing another user could have put there.

Every directory and file the builder reads, compiles in, links or loads under
the cache is checked without following symbolic links: one ``lstat`` per
directory, an ``O_NOFOLLOW`` open and ``fstat`` per file read. It must be a
real directory or a regular file, owned by us (the effective uid), and not
writable by group or others; anything else raises ``UnsafeCacheDirError``
naming the path and the fix. An entry that passes can be changed only by us
(or root), and so can everything inside a directory that passes, so a path
checked this way may be handed on (to the compiler, to ``dlopen``): nobody
else can swap a component between the check and the use.

The directories above the cache root are checked once per load as well
(``trusted_root``): each must belong to root or to us and must not be
writable by others unless it is sticky (``/tmp``), or by a group other than
our own; otherwise whoever can write there could rename the cache away and
put their own in its place.

What the builder creates gets explicit modes whatever the umask: directories
0700, files 0600 (libraries 0700). Files are written under a temporary name
opened with ``O_EXCL | O_NOFOLLOW`` and renamed into place.
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Dict, List, Optional, Tuple


__all__ = ["trusted_root", "trusted_store", "check_dir", "check_file", "check_tree", "read_file", "make_dir",
           "make_dirs",
           "write_file", "stamp_of"]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO planted where a file should be must not block the open


def _unsafe(message: str) -> BaseException:
    """``UnsafeCacheDirError(message)``; the errors module is imported only when refusing (a warm load()
    never needs it)."""
    from ..errors import UnsafeCacheDirError
    return UnsafeCacheDirError(message)


def _refuse(path: Path, problem: str, fix: str) -> BaseException:
    return _unsafe(f"opbuilder cache entry {path} {problem}; nothing is built or loaded from it. "
                               f"Fix: {fix}")


def _check(path: Path, st: os.stat_result, want_dir: bool, owner: Optional[int] = None) -> os.stat_result:
    """Raise unless ``st`` (an lstat of ``path``) is a directory/regular file of ours (of ``owner``, in a
    prebuilt store), not group/other-writable."""
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        raise _refuse(path, f"is a symbolic link (to {target}), and opbuilder follows none in its cache",
                      f"remove the link (rm {path}); opbuilder creates what it needs")
    if want_dir and not stat.S_ISDIR(mode):
        raise _refuse(path, "is not a directory", f"remove it (rm {path}); opbuilder creates what it needs")
    if not want_dir and not stat.S_ISREG(mode):
        raise _refuse(path, "is not a regular file", f"remove it (rm -r {path}); opbuilder writes it again")
    if owner is not None and st.st_uid != owner:
        raise _refuse(path, f"belongs to uid {st.st_uid}, not to the owner of its prebuilt store (uid {owner})",
                      f"have the store's owner remove it (rm -r {path}) and fill the store again")
    if owner is None and st.st_uid != os.geteuid():
        raise _refuse(path, f"belongs to uid {st.st_uid}, not to you (uid {os.geteuid()})",
                      f"remove it (rm -r {path}), or set OPBUILDER_CACHE_DIR to a directory of your own")
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise _refuse(path, f"is writable by group or others (mode {stat.S_IMODE(mode):o})", f"chmod go-w {path}")
    return st


def check_dir(path: Path, owner: Optional[int] = None) -> os.stat_result:
    """lstat ``path`` and refuse it unless it is a directory of ours (of ``owner``) that only its owner
    can write. ``FileNotFoundError`` if it does not exist."""
    return _check(path, os.lstat(path), True, owner)


def check_file(path: Path, owner: Optional[int] = None) -> os.stat_result:
    """lstat ``path`` and refuse it unless it is a regular file of ours (of ``owner``) that only its
    owner can write."""
    return _check(path, os.lstat(path), False, owner)


def check_tree(directory: Path) -> None:
    """Check ``directory`` and everything in it, at every depth (what the compiler will read or overwrite)."""
    check_dir(directory)
    todo = [directory]
    while todo:
        d = todo.pop()
        with os.scandir(d) as entries:
            for e in entries:
                st = e.stat(follow_symlinks=False)
                _check(Path(e.path), st, stat.S_ISDIR(st.st_mode))
                if stat.S_ISDIR(st.st_mode):
                    todo.append(Path(e.path))


def read_file(path: Path, owner: Optional[int] = None) -> bytes:
    """The bytes of a regular file of ours (of ``owner``), opened without following a symlink.
    ``FileNotFoundError`` if it does not exist; ``UnsafeCacheDirError`` if it is not to be trusted."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | _NONBLOCK)
    except OSError as e:
        if e.errno == errno.ELOOP:  # the last component is a symlink
            check_file(path, owner)  # raises, naming the link
        raise
    try:
        # the first request is the file's size and a byte more (its end, in one read, unless it grew):
        # a fixed 1 MiB request cost a 1 MiB allocation per read (~20 us, ~80 us the first in a
        # process; a warm load() reads five files)
        want = _check(path, os.fstat(fd), False, owner).st_size + 1
        chunks = []
        while True:
            chunk = os.read(fd, want)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            want = 1 << 16
    finally:
        os.close(fd)


def make_dir(path: Path, mode: int = 0o700) -> Path:
    """``path`` as a checked directory of ours, created with ``mode`` (whatever the umask) if it is
    missing; its parent must exist and be checked already."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    else:
        os.chmod(path, mode)
    check_dir(path)
    return path


def make_dirs(base: Path, path: Path) -> Path:
    """``make_dir`` for each component of ``path`` below ``base`` (a checked directory), top down."""
    rel = path.relative_to(base)
    d = base
    for part in rel.parts:
        d = d / part
        make_dir(d)
    return path


def write_file(path: Path, data: bytes, mode: int = 0o600, durable: bool = False) -> None:
    """Replace ``path`` with ``data`` so readers see the old or the new contents, never a part.

    Written to a new file beside it (``O_EXCL | O_NOFOLLOW``, mode set
    explicitly), flushed to disk first when ``durable``, then renamed over
    ``path`` (a symlink there is replaced, never followed). On any failure
    (a full disk) the temporary file is removed and the error raised.
    """
    import threading

    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, mode)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError) and e.filename is None:
            e.filename = str(path)  # os.write's errors (a full disk) name no file
        raise


def stamp_of(st: os.stat_result) -> list:
    """What changes whenever a file's contents may have: size, mtime, ctime, inode, device."""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def _check_above(real: Path, root: Path, owner: Optional[int] = None, links: bool = False,
                 known: Optional[Dict[str, os.stat_result]] = None) -> None:
    """Refuse if a directory above the cache could be written by someone other than us and root (and,
    for a prebuilt store, its ``owner``). For a store: ``real`` may be the path as given, whose
    symbolic links are then allowed (their directories are what is checked), and a sticky directory
    writable by others is not enough when the store belongs to another user (anyone could have made
    it there first). ``known``: lstat results already taken of some of them, by path."""
    owners = (0, os.geteuid()) if owner is None else (0, os.geteuid(), owner)
    what, var = ("cache", "OPBUILDER_CACHE_DIR") if owner is None else ("prebuilt store", "OPBUILDER_PREBUILT_DIR")
    known = known or {}
    path = os.fspath(real)
    above = _above(path)  # plain strings: no Path per directory
    for d, child in zip(above, [path, *above]):
        # in a sticky directory others can write, an entry belongs to whoever made it first: fine when
        # the entry on our way is ours or root's; for a store, one of its owner's there could be anyone's
        try:
            sticky_ok = owner is None or os.lstat(child).st_uid in (0, os.geteuid())
        except OSError:
            sticky_ok = True  # not there (a cache made later, by us)
        try:
            st = known.get(d) or os.lstat(d)
        except FileNotFoundError:
            continue  # created by us, 0700, when the cache is
        mode = st.st_mode
        problem = None
        if stat.S_ISLNK(mode):
            if links:
                continue  # the directory holding it is checked as the next parent, its target by the caller
            problem = "became a symbolic link while it was being checked"
        elif st.st_uid not in owners:
            problem = f"belongs to uid {st.st_uid}"
        elif (mode & stat.S_IWOTH or (mode & stat.S_IWGRP and st.st_gid != os.getegid())) and \
                not (mode & stat.S_ISVTX and sticky_ok):
            problem = f"is writable by {'others' if mode & stat.S_IWOTH else f'group {st.st_gid}'} " \
                      f"(mode {stat.S_IMODE(mode):o})" + \
                      (" and not sticky" if sticky_ok else f", and {child} in it belongs to another user")
        if problem:
            raise _unsafe(
                f"{d}, a directory above the opbuilder {what} {root}, {problem}: another user could replace "
                f"the {what} with their own; nothing is built or loaded from it. Fix: set {var} to "
                f"a directory whose parents only you and root can write (or chmod o-w,g-w {d})")


def trusted_root(root: Path, create: bool = True) -> Path:
    """The cache root, created (0700) if missing (else ``FileNotFoundError``) and checked, with the
    links above it resolved.

    The root itself must not be a symbolic link; links above it are resolved
    once here and the real path is what the builder uses, after checking that
    nobody but us and root can write to any directory along it.
    """
    chain = _lstat_chain(os.fspath(root))
    if chain is not None:  # there, and no link on the way: ``root`` is its own real path, each lstat'ed once
        _check_above(root, root, known=chain)
        return _checked_root(root if isinstance(root, Path) else Path(root), chain[os.fspath(root)])
    st: Optional[os.stat_result]
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISLNK(st.st_mode):
        target = os.path.realpath(root)
        raise _unsafe(
            f"opbuilder cache directory {root} is a symbolic link (to {target}); nothing is built or loaded from "
            f"it: whoever can change the link can change what is loaded. Fix: set OPBUILDER_CACHE_DIR={target} "
            f"(the directory itself)")
    real = Path(os.path.realpath(root))
    _check_above(real, root)
    if st is None:
        if not create:
            raise FileNotFoundError(2, "the opbuilder cache directory does not exist", str(root))
        missing = [real]
        missing += [p for p in real.parents if not os.path.lexists(p)]
        for d in reversed(missing):
            make_dir(d) if d == real else _make_parent(d)
    return _checked_root(real, os.lstat(real))


def _above(path: str) -> List[str]:
    """The directories above the absolute, normal ``path``, nearest first, up to "/"."""
    out = []
    i = path.rfind("/")
    while i > 0:
        out.append(path[:i])
        i = path.rfind("/", 0, i)
    if path != "/":
        out.append("/")
    return out


def _lstat_chain(path: str) -> Optional[Dict[str, os.stat_result]]:
    """The lstat of ``path`` and of each directory above it, by path, if ``path`` is absolute and normal
    and all of them exist and none is a symbolic link (then ``path`` is its own real path); else None."""
    if not path.startswith("/") or path.startswith("//") or os.path.normpath(path) != path:
        return None
    out = {}
    for d in [path, *_above(path)]:
        try:
            st = os.lstat(d)
        except OSError:
            return None
        if stat.S_ISLNK(st.st_mode):
            return None
        out[d] = st
    return out


def _checked_root(real: Path, st: os.stat_result) -> Path:
    """``real``, the cache root whose lstat is ``st``, if it is a directory of ours only we can write."""
    if not stat.S_ISDIR(st.st_mode):
        raise _unsafe(f"opbuilder cache path {real} is not a directory; set OPBUILDER_CACHE_DIR "
                                  f"to a directory")
    if st.st_uid != os.geteuid():
        raise _unsafe(
            f"opbuilder cache directory {real} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}); nothing is "
            f"built or loaded from it. Set OPBUILDER_CACHE_DIR to a directory of your own.")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise _unsafe(
            f"opbuilder cache directory {real} is writable by group or others (mode "
            f"{stat.S_IMODE(st.st_mode):o}); nothing is built or loaded from it. Fix: {shared_dir_fix(real, st)}")
    return real


def shared_dir_fix(real: Path, st: os.stat_result) -> str:
    """How to fix a cache root others may write: a shared directory (the sticky bit, as /tmp has) is never
    to be closed to its other users, so the fix is a private directory inside it; else closing it."""
    if st.st_mode & stat.S_ISVTX:
        return (f"{real} is a shared directory (sticky bit): set OPBUILDER_CACHE_DIR to a private directory "
                f"of your own, e.g. {real / 'opbuilder-cache'} (opbuilder creates it with mode 700)")
    return f"chmod 700 {real} (if only you use it), or set OPBUILDER_CACHE_DIR to a private directory"


def trusted_store(root: Path) -> Optional[Tuple[Path, int]]:
    """A prebuilt store (``OPBUILDER_PREBUILT_DIR``): its real path and owner, or None if it does not exist.

    Anyone may own it (root, a CI user), but only its owner may write to it
    or to anything in it (checked entry by entry as it is read), and the
    directories above it must be writable only by root, us or that owner;
    otherwise ``UnsafeCacheDirError`` naming it.
    """
    try:
        st = os.stat(root)
    except (FileNotFoundError, NotADirectoryError):
        return None
    real = Path(os.path.realpath(root))
    given = Path(os.path.abspath(root))
    if given != real:  # links on the way: the directories holding them, and each link's target, are checked too
        _check_above(given, root, st.st_uid, links=True)
        for link in (p for p in [given, *given.parents] if p.is_symlink()):
            _check_above(Path(os.path.realpath(link)) / "x", root, st.st_uid)
    _check_above(real, root, st.st_uid)
    st = os.lstat(real)
    if not stat.S_ISDIR(st.st_mode):
        raise _unsafe(f"opbuilder prebuilt store {root} is not a directory; nothing is loaded from it. "
                                  f"Fix: set OPBUILDER_PREBUILT_DIR to directories filled by "
                                  f"'python -m opbuilder build ... --into DIR'")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise _unsafe(
            f"opbuilder prebuilt store {real} is writable by users other than its owner (uid {st.st_uid}, mode "
            f"{stat.S_IMODE(st.st_mode):o}): any of them could plant code that load() would run; nothing is loaded "
            f"from it. Fix: chmod go-w {real} (as its owner), or take it out of OPBUILDER_PREBUILT_DIR")
    return real, st.st_uid


def _make_parent(d: Path) -> None:
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        return
    os.chmod(d, 0o700)
