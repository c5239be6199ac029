"""A per-operator build lock that the kernel releases when its holder dies.

filelock's Unix lock is ``flock(2)``: a build killed with SIGKILL drops it at
once, so no later ``load()`` waits on a dead process.
"""
from __future__ import annotations

import contextlib
import logging
import sys
from pathlib import Path
from typing import Iterator

import filelock

__all__ = ["build_lock"]

log = logging.getLogger("opbuilder")


@contextlib.contextmanager
def build_lock(op_dir: Path, name: str) -> Iterator[None]:
    lock = filelock.FileLock(str(op_dir / ".lock"))
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
