"""Running ninja: a one-line progress status, the full log kept, errors made readable,
and nothing left running by a build that was killed.

ninja runs each command in a process group of its own, so SIGKILL of the
Python process -- or of its whole process group -- leaves ninja or the
compilers it started running, still writing into the build directory. Every
process of a build inherits ``OPBUILDER_BUILD_DIR=<build dir>`` in its
environment and a build writes a ``.building`` marker (its pid and session)
that only a finished run removes; the next build of the operator (holding the
lock, so no live build of it exists) finds a marker, kills the leftovers, and
only then touches the directory.

A leftover is a process that carries that variable, works in the build
directory (ninja starts every command there) and is in the dead build's
session (ninja's commands stay in it). A server that a compiler wrapper
started during the build (an sccache server, say) inherited the variable
too, but daemons move to a session of their own or to another directory:
those are left alone.
"""
from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Set

from ..errors import BuildError, BuildTimeout
from ..cache.trust import read_file, write_file
from .build_limits import check_stop as _check_stop, deadline as _deadline, quiet as _quiet, thread_setting
from .build_limits import time_limit  # noqa: F401  (re-exported: where run_ninja's limits are set)

__all__ = ["run_ninja", "first_errors", "stop_leftovers", "when_started", "time_limit", "MARKER", "ENV_MARK"]

MARKER = ".building"
ENV_MARK = "OPBUILDER_BUILD_DIR"

log = logging.getLogger("opbuilder")
_hooks = threading.local()  # on_start: called in this thread once a run_ninja has started ninja
_STATUS = "@@opbuilder "
_STATUS_RE = re.compile(re.escape(_STATUS) + r"\[(\d+)/(\d+)\] (.*)")
_ERROR_RE = re.compile(r"^(?P<loc>[^\s:][^:]*:\d+(?::\d+)?):\s*(?:fatal )?error[:\s]")
# the linker's errors: the known phrasings, and any line the linker itself prefixes ("/usr/bin/ld: ...",
# "ld.lld: ...": a relocation without -fPIC, a file it cannot find or read), its warnings left out
_LINK_RE = re.compile(r"undefined reference to|multiple definition of|cannot find -l|ld returned|ld: error|"
                      r"linker command failed|^\S*\bld(?:\.\w+)?: ?(?!warning)\S")


class _Status:
    """Writes 'opbuilder: building NAME [n/N] what' on one line of stderr."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.tty = sys.stderr.isatty()
        self.shown = False

    def show(self, text: str) -> None:
        if _quiet():
            return
        line = f"opbuilder: building {self.name} {text}"
        if self.tty:
            sys.stderr.write("\r\033[K" + line)
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()
        self.shown = True

    def done(self, text: str) -> None:
        if _quiet():
            return
        if self.tty and self.shown:
            sys.stderr.write("\r\033[K")
        sys.stderr.write(f"opbuilder: {text}\n")
        sys.stderr.flush()


def first_errors(output: str, limit: int = 6) -> List[str]:
    """The compiler's first error lines (file:line: error ...) and link errors, with context.

    A failed ``static_assert`` comes first (opbuilder's checks of a ``Function<T>`` are ones), followed
    by the template it fired in and the user's line that required it: the assertion's message is
    fixed text, those lines name the user's class.
    """
    lines = output.splitlines()
    asserts: List[str] = []
    picked: List[str] = []
    for i, line in enumerate(lines):
        if _ERROR_RE.match(line) or _LINK_RE.search(line):
            into = asserts if _ASSERT_RE.search(line) else picked
            into.append(line)
            if into is asserts:
                into += _instantiation(lines, i)
            # gcc follows an error with the offending source line and a caret
            for extra in lines[i + 1:i + 3]:
                if extra.startswith(" ") and not _ERROR_RE.match(extra):
                    into.append(extra)
            if sum(1 for p in asserts + picked if not p.startswith(" ")) >= limit:
                break
    return asserts + picked


_ASSERT_RE = re.compile(r"error: static assert(ion)? failed|error: static_assert failed")
_QUOTED = r"[\u2018'`](?P<what>.*)[\u2019']"
_INSTANCE_RE = re.compile(r"[Ii]n instantiation of (?:template class )?" + _QUOTED)
_HERE_RE = re.compile(r"^(?P<loc>[^\s:][^:]*:\d+(?::\d+)?):\s+required from here")
_CHECKS_RE = re.compile(r"FunctionChecks<(?P<cls>[^,<>]+)")


def _instantiation(lines: List[str], i: int) -> List[str]:
    """For the static_assert error at ``lines[i]``: the template it fired in and where the user's code
    required it (gcc prints both before the error, clang as notes after it), as indented lines."""
    what = here = None
    j = i - 1
    while j >= 0 and not _ERROR_RE.match(lines[j]) and (what is None or here is None):  # gcc
        m = _HERE_RE.match(lines[j])
        here = here or (m.group("loc") if m else None)
        m = _INSTANCE_RE.search(lines[j])
        what = what or (m.group("what") if m else None)
        j -= 1
    for line in lines[i + 1:i + 40]:  # clang: "note: in instantiation of template class '...' requested here"
        if what is not None or _ERROR_RE.match(line):
            break
        m = _INSTANCE_RE.search(line)
        if m:
            what, here = m.group("what"), line.split(": note:", 1)[0]
    if what is None:
        return []
    cls = _CHECKS_RE.search(what)
    name = f"Function<{cls.group('cls').strip()}>" if cls else what
    return [f"  in {name}" + (f", required from {here}" if here else "")]


def _leftover_pids(build_dir: Path, session: Optional[int]) -> List[int]:
    """Live processes (not zombies) of a build of ``build_dir``: its variable in their environment,
    ``build_dir`` as their working directory and, if known, ``session`` as their session."""
    needle = f"{ENV_MARK}={build_dir}\0".encode()
    cwd = os.path.realpath(build_dir)
    me = os.getpid()
    pids = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read():
                    continue
            if os.readlink(f"/proc/{entry}/cwd") != cwd:
                continue  # a daemon that moved elsewhere
            if session is not None and os.getsid(int(entry)) != session:
                continue  # a daemon in a session of its own
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # gone, or not ours to read
        if state not in (b"Z", b"X"):
            pids.append(int(entry))
    return pids


def _marker_session(marker: Path) -> Optional[int]:
    """The session of the build that wrote ``marker`` (``PID SID``); None if it does not say."""
    try:
        return int(read_file(marker).split()[1])
    except (FileNotFoundError, IndexError, ValueError):
        return None


def stop_leftovers(build_dir: Path) -> int:
    """If the last build of ``build_dir`` never finished, kill what it left running; how many.

    Call with the operator's lock held (so no live build of it exists).
    """
    marker = build_dir / MARKER
    if not marker.exists():
        return 0
    killed = _kill_build_processes(build_dir, _marker_session(marker), set(), 0.02)
    if killed:
        log.info("stopped %d process(es) left running by a killed build in %s", len(killed), build_dir)
    marker.unlink(missing_ok=True)
    return len(killed)


@contextmanager
def when_started(callback: Callable[[], None]) -> Iterator[None]:
    """Within the block, ``callback()`` runs in this thread once each ``run_ninja`` has started ninja
    (torch_bridge.py: a test session waits until the bridge's compiler runs, not until it is done)."""
    with thread_setting(_hooks, "on_start", callback):
        yield


def _stop_build(proc: subprocess.Popen, build_dir: Path) -> int:
    """Kill ninja and every process of its build (the compilers it started, and theirs): how many.

    They are found as leftovers are (``_leftover_pids``: our session, the build's variable, its
    directory), so a compiler whose parent already died is found too; looked for again until none
    is left, since a driver may start its next stage between one look and the kill."""
    killed = set()
    try:
        proc.kill()
        killed.add(proc.pid)
    except OSError:
        pass
    return len(_kill_build_processes(build_dir, os.getsid(0), killed, 0.01))


def _kill_build_processes(build_dir: Path, session: Optional[int], killed: Set[int], pause: float) -> Set[int]:
    """SIGKILL every process of ``build_dir``'s build in ``session`` (``_leftover_pids``), looking again
    every ``pause`` s until none is left (a driver may start its next stage between a look and the
    kill), for at most 10 s; ``killed`` with the pids killed added."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pids = _leftover_pids(build_dir, session)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except OSError:
                pass
        time.sleep(pause)
    return killed


def _timed_out(name: str, seconds: float, text: str, log_path: Path, killed: int) -> BuildTimeout:
    return BuildTimeout(f"building operator '{name}' timed out after {seconds:g} s: ninja and its compilers "
                        f"({killed} process(es)) were killed; nothing was published. Give it more time, or "
                        f"look for a runaway compile-time computation (a constexpr loop, deep template "
                        f"recursion)\nfull log: {log_path}", name=name, seconds=seconds, log=text,
                        log_path=str(log_path))


def _diagnostics(text: str, build_dir: Path, env: dict, is_user: Optional[Callable[[str], bool]],
                 deadline: Optional[float]) -> Callable[[], list]:
    """The failed build's diagnostics (diagnostics.py), worked out when first read: within what is left
    of the time limit (load_many reads them at once), else within a minute."""
    def work() -> list:
        from .diagnostics import from_build_log
        left = 60.0 if deadline is None else deadline - time.monotonic()  # none left: the text alone
        return from_build_log(text, str(build_dir), is_user or (lambda p: True), env, timeout=left)
    return work


def run_ninja(ninja: str, build_dir: Path, jobs: int, name: str, verbose: bool,
              is_user: Optional[Callable[[str], bool]] = None) -> int:
    """Run ninja in ``build_dir``; raise BuildError naming ``name`` on failure, with its diagnostics at
    the files ``is_user`` says are the user's (compile/diagnostics.py); ``BuildTimeout`` past the
    thread's ``time_limit``.

    Returns the start of the run on the file-system clock (the marker's ctime,
    in ns), so callers can tell inputs that changed while it ran.
    """
    deadline, seconds = _deadline()  # build_limits.time_limit
    log_path = build_dir / "build.log"
    if deadline is not None and time.monotonic() >= deadline:
        raise _timed_out(name, seconds, "", log_path, 0)
    env = dict(os.environ)
    env["NINJA_STATUS"] = _STATUS + "[%f/%t] "
    env[ENV_MARK] = str(build_dir)
    argv = [ninja, "-j", str(jobs)] + (["-v"] if verbose else [])
    status = _Status(name)
    marker = build_dir / MARKER
    write_file(marker, f"{os.getpid()} {os.getsid(0)}\n".encode())
    # its ctime is the start; changed again once its ctime was read, it gets a fine-grained one where
    # the kernel has multigrain timestamps (6.13+) instead of the clock tick's floor, which a source
    # saved just before, in the same tick, shares (that build would count as changed and run twice)
    os.lstat(marker)
    os.chmod(marker, 0o600)
    started = os.lstat(marker).st_ctime_ns
    t0 = time.perf_counter()
    log.info("building %s in %s (%d jobs)", name, build_dir, jobs)
    # umask 077: what ninja and the compilers create (objects, depfiles, the library) is ours alone,
    # as everything else in the cache (trust.py refuses group- or other-writable files)
    _check_stop(f"building operator '{name}'")  # an interrupted load_many starts no compiler
    proc = subprocess.Popen(argv, cwd=build_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, errors="replace", umask=0o077)
    try:  # stopped while it started: the interrupt's sweep (many.py) may have looked before it was there
        _check_stop(f"building operator '{name}'")
    except BaseException:
        _stop_build(proc, build_dir)
        proc.stdout.close()  # type: ignore[union-attr]
        raise
    watchdog = None
    stopped: List[int] = []
    if deadline is not None:
        watchdog = threading.Timer(max(deadline - time.monotonic(), 0.0),
                                   lambda: stopped.append(_stop_build(proc, build_dir)))
        watchdog.daemon = True
        watchdog.start()
    on_start = getattr(_hooks, "on_start", None)
    if on_start is not None:
        on_start()
    out: List[str] = []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            m = _STATUS_RE.match(line)
            if m:
                what = m.group(3).strip()
                if verbose:
                    sys.stderr.write(what + "\n")
                status.show(f"[{m.group(1)}/{m.group(2)}] {what if not verbose else ''}".rstrip())
                out.append(what + "\n")
            else:
                out.append(line)
        rc = proc.wait()
    except BaseException:  # KeyboardInterrupt: stop ninja (it stops its commands) before leaving
        proc.terminate()
        proc.wait()
        raise
    finally:
        proc.stdout.close()  # read to its end (or ninja stopped): closed here, not left to the collector
        if watchdog is not None:
            watchdog.cancel()
            watchdog.join()
    elapsed = time.perf_counter() - t0
    text = "".join(out)
    if stopped:  # past the deadline: killed (again now, for a compiler that started as it happened)
        killed = stopped[0] + _stop_build(proc, build_dir)
        marker.unlink(missing_ok=True)
        write_file(log_path, text.encode())
        status.done(f"building {name} timed out")
        raise _timed_out(name, seconds, text, log_path, killed)
    marker.unlink(missing_ok=True)
    write_file(log_path, text.encode())
    if rc != 0:
        status.done(f"building {name} failed")
        errs = first_errors(text) or [ln for ln in text.splitlines() if ln.strip()][-8:]
        msg = (f"building operator '{name}' failed:\n" + "\n".join(errs) +
               f"\nfull log: {log_path}")
        raise BuildError(msg, name=name, log=text, log_path=str(log_path),
                         diagnostics=_diagnostics(text, build_dir, env, is_user, deadline))
    status.done(f"built {name} in {elapsed:.1f}s")
    log.info("built %s in %.1fs", name, elapsed)
    return started
