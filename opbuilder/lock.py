"""A per-operator build lock that the kernel releases when its holder dies.

filelock's ``UnixFileLock`` is ``flock(2)`` on ``<op>/.lock``: a build killed
with SIGKILL drops it at once, so no later ``load()`` waits on a dead
process (what the dead build left running is dealt with in ninja_run.py).
Never a "soft" lock file whose mere existence means locked: that is what
makes other builders hang forever after a crash. On a file system without
``flock`` (some FUSE and network mounts) filelock may fall back to one; the
builder never does: it raises a ``BuildError`` that names the directory.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import sys
from inspect import signature
from pathlib import Path
from typing import ContextManager, Dict, Iterator, Optional

import filelock

from .cache_dir import LOCK_FILE
from .errors import BuildError

__all__ = ["build_lock", "try_lock", "wait_lock"]

log = logging.getLogger("opbuilder")

# filelock 3.30+ can be told never to fall back to a soft lock; 3.24-3.29 fall back by changing the
# lock's class (checked after each attempt, in _attempt); older versions raise NotImplementedError
_NO_SOFT: Dict[str, bool] = {"fallback_to_soft": False}
if "fallback_to_soft" not in signature(filelock.UnixFileLock.__init__).parameters:
    _NO_SOFT = {}


def _lock(op_dir: Path) -> filelock.BaseFileLock:
    return filelock.UnixFileLock(str(op_dir / LOCK_FILE), **_NO_SOFT)


def _no_flock(op_dir: Path, why: str, name: Optional[str]) -> BuildError:
    lead = f"building operator '{name}' failed: " if name else ""
    return BuildError(f"{lead}cannot lock {op_dir / LOCK_FILE}: the file system of {op_dir} does not support "
                      f"flock(2) ({why}); opbuilder locks only with flock, which the kernel releases when a build "
                      f"dies. Set OPBUILDER_CACHE_DIR to a directory on a local file system",
                      name=name or op_dir.name)


def _attempt(lock: filelock.BaseFileLock, op_dir: Path, name: Optional[str], timeout: float) -> bool:
    """Acquire ``lock`` within ``timeout`` seconds (< 0: wait); False on timeout. Never a soft lock."""
    try:
        lock.acquire(timeout=timeout)
        held = True
    except filelock.Timeout:
        held = False
    except NotImplementedError as e:  # filelock before 3.24: flock missing
        raise _no_flock(op_dir, str(e), name) from e
    except OSError as e:  # fallback_to_soft=False: flock missing
        if e.errno != errno.ENOSYS:
            raise
        raise _no_flock(op_dir, e.strerror or str(e), name) from e
    if type(lock) is not filelock.UnixFileLock:  # a filelock that turned itself into a soft lock
        if held:
            lock.release()
        raise _no_flock(op_dir, f"filelock fell back to {type(lock).__name__}", name)
    return held


@contextlib.contextmanager
def build_lock(op_dir: Path, name: str) -> Iterator[None]:
    """Hold the build lock of one operator; says so on stderr if another process has it."""
    lock = _lock(op_dir)
    if not _attempt(lock, op_dir, name, 0):
        sys.stderr.write(f"opbuilder: waiting for another process that is building {name}\n")
        log.info("waiting for the build lock of %s", name)
        _attempt(lock, op_dir, name, -1)
    try:
        yield
    finally:
        lock.release()


@contextlib.contextmanager
def wait_lock(directory: Path, timeout: float) -> Iterator[bool]:
    """``directory``'s lock, waiting up to ``timeout`` seconds (< 0: as long as it takes) and saying nothing;
    yields whether it is held (for work that may be skipped, such as caching a probe's result)."""
    lock = _lock(directory)
    if not _attempt(lock, directory, None, timeout):
        yield False
        return
    try:
        yield True
    finally:
        lock.release()


def try_lock(op_dir: Path) -> ContextManager[bool]:
    """The lock if it is free right now (yields True), else yields False without waiting."""
    return wait_lock(op_dir, 0)
