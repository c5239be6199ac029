"""A per-operator build lock that the kernel releases when its holder dies.

filelock's ``UnixFileLock`` is ``flock(2)`` on ``<op>/.lock``: a build killed
with SIGKILL drops it at once, so no later ``load()`` waits on a dead
process (what the dead build left running is dealt with in ninja_run.py).
Never a "soft" lock file whose mere existence means locked: that is what
makes other builders hang forever after a crash.
"""
from __future__ import annotations

import contextlib
import logging
import sys
from pathlib import Path
from typing import Iterator

import filelock

from .cache_dir import LOCK_FILE

__all__ = ["build_lock", "try_lock"]

log = logging.getLogger("opbuilder")


def _lock(op_dir: Path) -> filelock.BaseFileLock:
    return filelock.UnixFileLock(str(op_dir / LOCK_FILE))


@contextlib.contextmanager
def build_lock(op_dir: Path, name: str) -> Iterator[None]:
    """Hold the build lock of one operator; says so on stderr if another process has it."""
    lock = _lock(op_dir)
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        sys.stderr.write(f"opbuilder: waiting for another process that is building {name}\n")
        log.info("waiting for the build lock of %s", name)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


@contextlib.contextmanager
def try_lock(op_dir: Path) -> Iterator[bool]:
    """The lock if it is free right now (yields True), else yields False without waiting."""
    lock = _lock(op_dir)
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        yield False
        return
    try:
        yield True
    finally:
        lock.release()
