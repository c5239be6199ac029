"""A per-operator build lock that the kernel releases when its holder dies.

filelock's ``UnixFileLock`` is ``flock(2)`` on ``<op>/.lock``: a build killed
with SIGKILL drops it at once, so no later ``load()`` waits on a dead
process (what the dead build left running is dealt with in ninja_run.py).
Never a "soft" lock file whose mere existence means locked: that is what
makes other builders hang forever after a crash. On a file system without
``flock`` (some FUSE and network mounts) filelock may fall back to one; the
builder never does: it raises a ``BuildError`` that names the directory.

A build that waits for the lock says which process holds it (its pid, from
``/proc/locks``) and whether that process is stopped (Ctrl-Z, SIGSTOP: it
keeps the lock and will not finish until continued), and gives up after
``OPBUILDER_LOCK_TIMEOUT`` seconds (default 1800) with a ``BuildError`` that
says so.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import sys
import time
from inspect import signature
from pathlib import Path
from typing import ContextManager, Dict, Iterator, Optional, Tuple

import filelock

from ..errors import BuildError
from .trust import check_file

__all__ = ["build_lock", "try_lock", "wait_lock", "lock_timeout", "lock_holder", "LOCK_TIMEOUT_S", "LOCK_FILE"]

LOCK_FILE = ".lock"  # the lock file in an operator's directory; never removed (cache_dir.remove_operator)

LOCK_TIMEOUT_S = 1800.0  # default of OPBUILDER_LOCK_TIMEOUT: how long a build waits for another's lock
_POLL_S = 1.0  # how often a waiting build looks at the holder again

log = logging.getLogger("opbuilder")

# filelock 3.30+ can be told never to fall back to a soft lock; 3.24-3.29 fall back by changing the
# lock's class (checked after each attempt, in _attempt); older versions raise NotImplementedError
_NO_SOFT: Dict[str, bool] = {"fallback_to_soft": False}
if "fallback_to_soft" not in signature(filelock.UnixFileLock.__init__).parameters:
    _NO_SOFT = {}


def _lock(op_dir: Path) -> filelock.BaseFileLock:
    path = op_dir / LOCK_FILE
    try:
        check_file(path)  # opened (created, if missing) by filelock, which would follow a symlink
    except FileNotFoundError:
        pass
    return filelock.UnixFileLock(str(path), mode=0o600, **_NO_SOFT)


def lock_timeout() -> float:
    """Seconds a build waits for another process's build lock: ``OPBUILDER_LOCK_TIMEOUT`` or 1800."""
    env = os.environ.get("OPBUILDER_LOCK_TIMEOUT", "").strip()
    if not env:
        return LOCK_TIMEOUT_S
    try:
        seconds = float(env)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0:
        raise ValueError(f"OPBUILDER_LOCK_TIMEOUT must be a positive number of seconds (or inf), got {env!r}")
    return seconds


def lock_holder(path: Path) -> Optional[Tuple[int, bool]]:
    """(pid, stopped) of the process holding the flock on ``path``, from ``/proc/locks``; None if unknown."""
    try:
        st = os.stat(path)
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    exact = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    found = None
    for line in lines:  # "1: FLOCK  ADVISORY  WRITE 6438 fe:00:2154551 0 EOF" (waiters: "1: -> FLOCK ...")
        parts = line.split()
        if len(parts) < 6 or parts[1] != "FLOCK" or not parts[4].isdigit():
            continue
        if parts[5] == exact:
            found = int(parts[4])
            break
        if found is None and parts[5].endswith(f":{st.st_ino}"):  # overlay file systems report another device
            found = int(parts[4])
    if not found:
        return None
    try:
        with open(f"/proc/{found}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return found, False
    return found, state in (b"T", b"t")


def _describe(holder: Optional[Tuple[int, bool]]) -> str:
    if holder is None:
        return "holder unknown"
    pid, stopped = holder
    return f"pid {pid}, stopped" if stopped else f"pid {pid}, running"


def _who(holder: Optional[Tuple[int, bool]]) -> str:
    """Who holds the lock, as the messages say it: another thread of this process (load_many's workers,
    a user's threads: /proc/locks names the process, ours) or another process (its pid, and whether it
    is stopped)."""
    if holder is not None and holder[0] == os.getpid():
        return f"another thread of this process (pid {holder[0]})"
    return f"another process ({_describe(holder)})"


def _who_builds(holder: Optional[Tuple[int, bool]], name: str) -> str:
    if holder is not None and holder[0] == os.getpid():
        return f"another thread of this process (pid {holder[0]}) that is building {name}"
    return f"another process that is building {name} ({_describe(holder)})"


def _own(holder: Optional[Tuple[int, bool]]) -> Optional[Tuple[int, bool]]:
    """``holder``, or None when it is this process: its state is ours (running), not the holder thread's."""
    return None if holder is not None and holder[0] == os.getpid() else holder


def _stopped_note(name: str, pid: int) -> str:
    return (f"opbuilder: process {pid}, which holds the build lock of {name}, is stopped (Ctrl-Z or SIGSTOP) and "
            f"will not finish until it is continued (kill -CONT {pid}, or fg in its shell)\n")


def _wait(lock: filelock.BaseFileLock, op_dir: Path, name: str) -> None:
    """Wait for ``lock``, saying who holds it, until OPBUILDER_LOCK_TIMEOUT; then a BuildError."""
    timeout = lock_timeout()
    path = op_dir / LOCK_FILE
    holder = lock_holder(path)
    sys.stderr.write(f"opbuilder: waiting for {_who_builds(holder, name)}; "
                     f"giving up after {timeout:g} s (OPBUILDER_LOCK_TIMEOUT)\n")
    log.info("waiting for the build lock of %s (held by %s)", name, _who(holder))
    holder = _own(holder)
    told = holder is not None and holder[1]
    if told:
        sys.stderr.write(_stopped_note(name, holder[0]))  # type: ignore[index]
    deadline = time.monotonic() + timeout
    from ..compile.build_limits import check_stop
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        if _attempt(lock, op_dir, name, min(_POLL_S, left)):
            return
        check_stop(f"waiting for the build lock of '{name}'")  # an interrupted load_many waits no longer
        holder = _own(lock_holder(path))
        stopped = holder is not None and holder[1]
        if stopped and not told:
            sys.stderr.write(_stopped_note(name, holder[0]))  # type: ignore[index]
        told = stopped
    holder = lock_holder(path)
    if _own(holder) is not None and holder[1]:  # type: ignore[index]
        pid = holder[0]  # type: ignore[index]
        advice = (f"process {pid} is stopped: continue it (kill -CONT {pid}, or fg in its shell) or end it, then "
                  f"load again")
    else:
        advice = "load again once that build is done, or set OPBUILDER_LOCK_TIMEOUT higher"
    raise BuildError(f"building operator '{name}' failed: gave up after waiting {timeout:g} s "
                     f"(OPBUILDER_LOCK_TIMEOUT) for the build lock {path}, held by {_who(holder)}; {advice}",
                     name=name)


def _no_flock(op_dir: Path, why: str, name: Optional[str]) -> BuildError:
    lead = f"building operator '{name}' failed: " if name else ""
    return BuildError(f"{lead}cannot lock {op_dir / LOCK_FILE}: the file system of {op_dir} does not support "
                      f"flock(2) ({why}); opbuilder locks only with flock, which the kernel releases when a build "
                      f"dies. Set OPBUILDER_CACHE_DIR to a directory on a local file system; to share builds "
                      f"across machines, keep that node-local cache and put them in a read-only prebuilt store on "
                      f"the shared file system (python -m opbuilder build ... --into DIR, then "
                      f"OPBUILDER_PREBUILT_DIR=DIR; see docs/fleet.md)",
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
    """Hold the build lock of one operator; says so on stderr (and who holds it) if another process
    has it, and gives up after OPBUILDER_LOCK_TIMEOUT seconds."""
    lock = _lock(op_dir)
    if not _attempt(lock, op_dir, name, 0):
        _wait(lock, op_dir, name)
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
