"""A precompiled header for ``opbuilder/extension.h``, built once per toolchain and flags.

Where a cold build's seconds go (g++ 12 at -O2, custom_src/function_ops.cpp):
roughly a quarter reading pybind11's and opbuilder's headers, the rest
generating code for pybind11's machinery and the operator. A precompiled
header (PCH) takes away the reading for every build after the first.

What a PCH cannot take away (g++ 12, nanobind README operator, -ftime-report):
g++ instantiates the function templates that the headers' inline functions
use at the end of each translation unit, after the point where a PCH is
written, so every operator pays for them again: an empty source with the PCH
costs ~0.3 CPU-s ("phase lang. deferred", 22 MB), against ~0.1 for nanobind's
own headers. The rest of a ~1 s operator is code generation ("phase opt and
generate"): its kernel, nanobind's dispatch of each bound function, and
Function<T>'s per-type glue. An inline helper only the core library calls
therefore belongs in src/core/ (OB_CORE_FN), not in a header
(benchmarks/builder.py --bindings prints the phases).

When it is used: gcc only (clang and nvcc refuse a PCH that does not match
instead of falling back), modules only (pybind11 and nanobind ones get one each: their
flags differ), and only for sources whose
first project include is ``opbuilder/extension.h`` or ``ms_extension.h`` with
nothing but ``#include <...>`` lines before it, so forcing the header first
cannot change what the source means. ``OPBUILDER_PCH=0`` turns it off.

How: ``<cache>/.pch/<key>/pch.h`` includes the header and ``pch.h.gch`` sits
next to it. The key hashes everything the PCH depends on (compiler identity,
flags but ``-flto``, opbuilder's headers, pybind11, Python). Sources compile with
``-include <dir>/pch.h``: gcc loads the ``.gch`` if it is there and valid and
otherwise reads ``pch.h`` as text -- the same code either way, so the
library's own key does not depend on the PCH.

The ``.gch`` is built by a detached, low-priority process that the first
build wanting it starts once everything its ``load()`` builds is published
(a nanobind operator's first ``load()`` also compiles nanobind's runtime and
the core library, in threads: ``after_builds``): nobody waits for it (a build
that comes before it is ready reads the header as text), and it survives the
builder exiting. It is not started next to any of those compiles, though a
core may be idle then: sharing the machine slowed a pybind11 compile by about
0.6 s of 10.5 on 2 cores, and a nanobind operator's first ``load()`` (its
runtime and core library still compiling) by about 1 s of 5.2. It
holds ``<key>/.lock`` while it works (one PCH build at a time), writes under a
temporary name and renames into place; its output is in ``<key>/build.log``.
It is not started when the build may run only one job (``MAX_JOBS=1`` or
little free memory). The three most recently used PCHs are kept.

The PCH is compiled into every eligible source, so it is trusted only as the
rest of the cache is (trust.py): ``.pch``, its key directory, ``pch.h`` and
``pch.h.gch`` must be real, ours, and writable by nobody else, or the build
is refused. A precompile that was killed leaves its temporary ``.gch`` (100+
MB) and gcc's temporary files (in ``<key>/.tmp``, its TMPDIR); the next
build that finds the PCH's lock free removes them.

Installed: ``pip install`` of opbuilder also precompiles the header for a nanobind operator with
the default options (install_build.py) into ``opbuilder/_native/`` (``pch.h``, ``pch.h.gch``), so
the first operator in a fresh cache compiles with it (about half the CPU time). native.json records
its key (``builder.installed_pch_key``: the PCH's identity with the toolchain's include directories
by what they are, not where, and this Python's full version), the compiler identity that built it
(path and version), its size and hash. A build uses it (``installed``) only when both match its own,
the files are regular, not links, and writable by their owner only (as the runtime beside them);
else the cache's own, as above. gcc checks a PCH itself as well (its own binary, the flags it
checks): one it refuses is read as text (``-Winvalid-pch`` says so), the same code.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Tuple

from ..cache.fingerprint import write_text_atomic
from ..cache.trust import check_dir, check_file, make_dir, read_file
from ..spec import switch_on

__all__ = ["Pch", "HEADER", "HEADER_TEXT", "installed", "enabled", "eligible", "prepare", "prune", "start_build",
           "start_when_idle", "after_builds", "clear_leftovers"]

HEADER = "opbuilder/extension.h"
_STARTS_WITH = ("opbuilder/extension.h", "ms_extension.h")  # ms_extension.h begins by including extension.h
KEEP = 3
HEADER_TEXT = f'// written by opbuilder: precompiled as pch.h.gch\n#include "{HEADER}"\n'
_COMMENTS = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_DIRECTIVE = re.compile(r"#\s*include\s*([<\"])([^>\"]+)[>\"]\s*$")


class Pch:
    """The precompiled header for one key: ``header`` to pass to ``-include``, ``gch`` beside it."""

    __slots__ = ("dir", "header", "gch")

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.header = directory / "pch.h"
        self.gch = directory / "pch.h.gch"

    @property
    def built(self) -> bool:
        return self.gch.is_file()


def enabled() -> bool:
    return switch_on("OPBUILDER_PCH", "1")


def eligible(source: Path) -> bool:
    """True if ``source`` starts (after comments and ``<system>`` includes) by including our header."""
    try:
        with open(source, "r", errors="replace") as f:
            head = f.read(1 << 16)
    except OSError:
        return False
    for line in _COMMENTS.sub(" ", head).splitlines():
        line = line.strip()
        if not line:
            continue
        m = _DIRECTIVE.match(line)
        if m is None:
            return False  # code, a #define, an #if...: forcing the header first could change the meaning
        if m.group(2) in _STARTS_WITH:
            return True
        if m.group(1) == '"':
            return False  # a project header first: it may set macros the header reads
    return False


def prepare(root: Path, key: str) -> Pch:
    """The PCH directory for ``key`` with its ``pch.h`` written (the .gch may not exist yet)."""
    pch = Pch(root / ".pch" / key)
    for d in (pch.dir.parent, pch.dir):
        make_dir(d)  # refuses a symlink, another user's directory, a group-writable one
    text = HEADER_TEXT
    try:
        current = read_file(pch.header)
    except FileNotFoundError:
        current = None
    if current != text.encode():
        write_text_atomic(pch.header, text)
    try:
        check_file(pch.gch)  # gcc loads it in place of pch.h
    except FileNotFoundError:
        pass
    now = time.time()
    os.utime(pch.dir, (now, now))  # recently used: kept by prune()
    return pch


def installed(key: str, cxx_identity: str) -> Optional[Pch]:
    """opbuilder's installed PCH (see the module's docstring) when it was built for ``key`` by the
    compiler ``cxx_identity``; None to use the cache's. Off with ``OPBUILDER_INSTALLED_RUNTIME=0``."""
    from .installed import enabled as installed_enabled
    from .installed import installed as native

    if not installed_enabled():
        return None
    nat = native()
    rec = nat.record.get("pch") if nat is not None else None
    if not isinstance(rec, dict) or rec.get("key") != key or rec.get("compiler") != cxx_identity:
        return None
    pch = Pch(nat.dir)  # type: ignore[union-attr]
    try:
        owner = os.lstat(pch.dir).st_uid  # site-packages may be root's: its owner, and nobody else, writes it
        check_dir(pch.dir, owner)
        if read_file(pch.header, owner) != HEADER_TEXT.encode():
            return None
        if check_file(pch.gch, owner).st_size != rec.get("size"):
            return None
    except OSError:  # missing, a link, writable by others: the cache's PCH instead
        return None
    return pch


def prune(root: Path, keep: int = KEEP, current: Optional[str] = None) -> None:
    """Keep the ``keep`` most recently used PCHs (the rest cost disk: 100+ MB each), and clear what
    killed precompiles left in those kept. Every build that uses a PCH calls this."""
    from ..cache.lock import try_lock

    base = root / ".pch"
    try:
        with os.scandir(base) as entries:
            dirs = sorted(((e.stat(follow_symlinks=False).st_mtime, Path(e.path)) for e in entries
                           if e.is_dir(follow_symlinks=False)), reverse=True)
    except OSError:
        return
    hour_ago = time.time() - 3600
    for i, (mtime, d) in enumerate(dirs):
        # one used in the last hour may be in use by a compile right now
        if i >= keep and d.name != current and mtime < hour_ago:
            shutil.rmtree(d, ignore_errors=True)
        else:  # kept: without what a killed precompile of it left (unless one is running now)
            try:
                with try_lock(d) as free:
                    if free:
                        clear_leftovers(Pch(d))
            except OSError:
                pass


def clear_leftovers(pch: Pch) -> int:
    """Remove what a killed precompile left in ``pch.dir`` (its temporary .gch, gcc's temporary files);
    how many. Call with the PCH's lock held, so that no precompile of it is running."""
    gone = 0
    for tmp in pch.dir.glob(".pch.h.gch.tmp-*"):
        tmp.unlink(missing_ok=True)
        gone += 1
    tmpdir = pch.dir / _TMPDIR
    if os.path.lexists(tmpdir):
        shutil.rmtree(tmpdir, ignore_errors=True) if tmpdir.is_dir() and not tmpdir.is_symlink() else tmpdir.unlink()
        gone += 1
    return gone


_TMPDIR = ".tmp"  # the precompile's TMPDIR, inside its directory, so that what it leaves is found
_WORKER = "from opbuilder.native.pch import build_now; sys.exit(build_now(sys.argv[2], sys.argv[3:]))"


def start_build(pch: Pch, cxx: Sequence[str], flags: Sequence[str]) -> bool:
    """Start the detached process that precompiles ``pch`` (unless one is at it); True if started."""
    from ..cache.lock import try_lock

    with try_lock(pch.dir) as free:
        if not free:
            return False
        if clear_leftovers(pch):
            import logging
            logging.getLogger("opbuilder").info("removed what a killed precompile left in %s", pch.dir)
        if pch.built:
            return False
    from ..compile import detached

    if detached.can_start() is not None:
        return False
    env = {k: v for k, v in os.environ.items() if k != "OPBUILDER_BUILD_DIR"}
    detached.start(detached.ON_PATH + _WORKER, [str(Path(__file__).resolve().parents[2]), str(pch.dir), *cxx, *flags],
                   env)
    return True


_held = threading.local()  # .starts: the PCH builds this thread holds back (after_builds), else absent


@contextmanager
def after_builds() -> Iterator[None]:
    """Hold back the PCH builds this thread asks for (``start_when_idle``) until the block ends: a
    ``load()`` that compiles other libraries in threads beside its operator (nanobind's runtime, the
    core library) wraps them and their joins in it, so the precompile never competes with them.
    The held builds start when the block ends, also when it raises an ``Exception`` (the operator
    may have been built; a dependency's error is raised all the same), not on an interrupt."""
    outer = getattr(_held, "starts", None)
    if outer is not None:  # nested: the outermost block starts them
        yield
        return
    starts: List[Tuple[Pch, Tuple[str, ...], Tuple[str, ...]]] = []
    _held.starts = starts
    try:
        yield
    except Exception:
        _held.starts = None
        _start_all(starts)
        raise
    except BaseException:
        _held.starts = None
        raise
    _held.starts = None
    _start_all(starts)


def start_when_idle(pch: Pch, cxx: Sequence[str], flags: Sequence[str]) -> None:
    """Start the precompile of ``pch`` now, or, inside ``after_builds`` in this thread, when that ends."""
    starts = getattr(_held, "starts", None)
    if starts is None:
        _start_all([(pch, tuple(cxx), tuple(flags))])
    else:
        starts.append((pch, tuple(cxx), tuple(flags)))


def _start_all(starts: Sequence[Tuple[Pch, Tuple[str, ...], Tuple[str, ...]]]) -> None:
    """Start each held precompile once. The PCH is optional: one that cannot be started (its
    directory removed by ``cache clean`` since the build used it) is logged, never raised, so the
    ``load()`` that built its operator still succeeds."""
    import logging

    log = logging.getLogger("opbuilder")
    done = set()
    for pch, cxx, flags in starts:
        if pch.dir in done:
            continue
        done.add(pch.dir)
        try:
            if start_build(pch, cxx, flags):
                log.info("precompiling opbuilder/extension.h in the background (%s)", pch.dir.name)
        except OSError as e:
            log.info("not precompiling opbuilder/extension.h in %s: %s", pch.dir, e)


def build_now(directory: str, command: List[str]) -> int:
    """In the detached process: compile ``<directory>/pch.h`` with ``command`` (compiler and flags)."""
    from ..cache.lock import try_lock

    pch = Pch(Path(directory))
    try:
        os.nice(10)  # the operator's own compile comes first
    except OSError:
        pass
    os.umask(0o077)
    with try_lock(pch.dir) as free:
        if not free or pch.built:
            return 0
        clear_leftovers(pch)
        os.environ["TMPDIR"] = str(make_dir(pch.dir / _TMPDIR))  # gcc's temporary files: found if we are killed
        tmp = pch.dir / f".pch.h.gch.tmp-{os.getpid()}"
        log_tmp = pch.dir / f".build.log.tmp-{os.getpid()}"
        log_fd = os.open(log_tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(log_fd, "w") as log:
            rc = subprocess.call([*command, "-x", "c++-header", str(pch.header), "-o", str(tmp)],
                                 stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        os.replace(log_tmp, pch.dir / "build.log")
        if rc == 0:
            os.replace(tmp, pch.gch)
        else:
            tmp.unlink(missing_ok=True)
        clear_leftovers(pch)
        return rc
