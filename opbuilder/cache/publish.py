"""Publishing builds atomically, checking them before use, and keeping the object directory honest.

A library is copied to ``<op>/<key>/.name.tmp-PID`` (mode 0700, ``O_EXCL``),
flushed to disk (fsync) and renamed over the final name, so a path that
exists is always complete; its size, SHA-256 and stat stamp go into
``build.json`` beside it (published.py checks them before every use). A
library that failed that check is replaced the same way, by a rename, so a
process that mapped the old file keeps its copy.

Builds are kept by use (published.py stamps the key directory when a load
uses it): the ``KEEP_BUILDS`` most recently used builds per operator stay.

Objects are trusted only through ``build/objects.json``, a record of the
contents (digests) of every input each object was compiled from, written
after a successful build. Before a build, an object whose record no longer
matches the files -- or that has no record, as after a build was killed
mid-compile -- is deleted and compiled again; the others are not touched.

What is recorded is what was compiled: a source's digest is the one hashed
into the base key, and the build counts as "changed while compiling" (not
recorded, not published, built again) if a source no longer has that digest
afterwards or if any input's ctime is at or after the build's start. ``>=``,
not ``>``: file clocks tick coarsely, and a save in the same tick as the
start may come after the compiler read the file. A spurious rebuild costs
seconds; a wrong record would publish a library under contents it was not
built from.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

from ..errors import warn_broken
from .fingerprint import ABSENT, bytes_digest, file_state, write_json_atomic
from ..compile.ninja_file import Step, depfile_inputs
from .published import INFO
from ..compile.search_path import SearchPath, absent_candidates, tracked
from .trust import read_file, stamp_of

__all__ = ["publish_library", "stale_steps", "record_objects", "changed_since", "recorded_inputs",
           "prune_old_builds", "KEEP_BUILDS", "write_build_info"]

KEEP_BUILDS = 8  # builds kept per operator: the most recently used
_RECORD = "objects.json"
_IDENTITY = "<compile identity>"  # flags, toolchain and opbuilder's headers (not in depfiles: -isystem)
_OBJECT = "<object>"  # the digest of the object file itself: a truncated or damaged object is compiled again
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
Record = Dict[str, Dict[str, str]]


def publish_library(built: Path, key_dir: Path, filename: str, mode: int = 0o700) -> Dict[str, object]:
    """Copy ``built`` to ``key_dir/filename`` (``mode``: 0755 in a prebuilt store): written under a new
    name, fsync'd, renamed over whatever is there (a damaged copy being replaced). Returns the record
    for ``build.json``: size, SHA-256 and stat stamp. A failure (a full disk) leaves no partial file behind."""
    import hashlib

    final = key_dir / filename
    for old in key_dir.glob(f".{filename}.tmp-*"):  # a publish killed half-way (we hold the lock)
        old.unlink(missing_ok=True)
    tmp = key_dir / f".{filename}.tmp-{os.getpid()}"
    h = hashlib.sha256()
    src = os.open(built, os.O_RDONLY | _NOFOLLOW)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, mode)
        try:
            os.fchmod(fd, mode)
            while True:
                chunk = os.read(src, 1 << 20)
                if not chunk:
                    break
                h.update(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename is None:
            e.filename = str(final)  # os.write's errors (a full disk) name no file
        raise
    finally:
        os.close(src)
    _fsync_dir(key_dir)
    st = os.lstat(final)
    return {"size": st.st_size, "sha256": h.hexdigest(), "stamp": stamp_of(st)}


def _fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (so a crash cannot leave the old name or none)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_build_info(key_dir: Path, spec, base: str, library: Dict[str, object], compiler=None,
                     binding: Optional[str] = None, headers: Optional[Iterable[str]] = None) -> None:
    """``build.json``: what was built, from what, the library's record, the binding library of a module
    (``cache list`` shows it), the C++ compiler's facts (the identity in its key: a node without a
    compiler looks a bundle's builds up with it, bundle.py), and the headers its key covers (the layout
    a store's manifest keeps for it when it is installed there, fleet/store.py)."""
    info = {"name": spec.name, "kind": spec.kind, "backend": spec.backend, "base": base,
            "sources": [str(s) for s in spec.sources], "built_at": time.time(), "library": library}
    if headers is not None:
        info["headers"] = sorted(headers)
    if binding is not None:
        info["binding"] = binding
    if compiler is not None:
        info["compiler"] = {"identity": compiler.identity, "family": compiler.family, "version": compiler.version,
                            "path": compiler.path}
    write_json_atomic(key_dir / INFO, info, durable=True)


def load_record(build_dir: Path) -> Record:
    """``objects.json``: for each object, its inputs' digests; entries of another shape are dropped
    (their objects are compiled again)."""
    path = build_dir / _RECORD
    try:
        data = json.loads(read_file(path))
    except FileNotFoundError:
        return {}
    except ValueError as e:
        warn_broken(path, f"not JSON: {e}", "compiling every object again")
        return {}
    if not isinstance(data, dict):
        warn_broken(path, "not a JSON object", "compiling every object again")
        return {}
    return {obj: deps for obj, deps in data.items()
            if isinstance(deps, dict) and all(isinstance(v, str) for v in deps.values())}


def _digest(path: str) -> Optional[str]:
    """The file's digest, ``ABSENT`` if it is not there, None if it cannot be read."""
    return file_state(Path(path))


def _read(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _current(deps: Dict[str, str], identity: str, sources: Dict[str, str]) -> bool:
    """True if an object's record matches: the sources as hashed into the key, other inputs as they are now."""
    if not isinstance(deps, dict) or deps.get(_IDENTITY) != identity:
        return False
    for path, digest in deps.items():
        if path in (_IDENTITY, _OBJECT):
            continue
        now = sources[path] if path in sources else _digest(path)
        if now != digest:
            return False
    return True


def stale_steps(build_dir: Path, steps: Sequence[Step], identity: str, sources: Dict[str, str]) -> List[Step]:
    """The steps whose object must be compiled; their stale objects and records are removed first,
    so a build that dies half-way leaves nothing that looks current. ``sources`` are the digests
    the base key was computed from."""
    record = load_record(build_dir)
    todo = []
    for s in steps:
        path = build_dir / s.obj
        deps = record.get(s.obj, {})
        if path.exists() and _current(deps, identity, sources) and _digest(str(path)) == deps.get(_OBJECT):
            continue
        todo.append(s)
        record.pop(s.obj, None)
        for p in (path, build_dir / (s.obj + ".d")):
            p.unlink(missing_ok=True)
    for tmp in build_dir.glob("obj/*.tmp*"):
        tmp.unlink(missing_ok=True)
    write_json_atomic(build_dir / _RECORD, record)
    return todo


def record_objects(build_dir: Path, compiled: Sequence[Step], identity: str, started_ns: int,
                   skip_under: Path, sources: Dict[str, str],
                   search: Optional[Dict[str, SearchPath]] = None) -> Optional[List[str]]:
    """Record the inputs' digests of freshly compiled objects, if they are what was compiled.

    ``sources`` are the digests the base key was computed from; ``search``, per
    rule, the compile's include search path (search_path.py): which inputs are
    tracked, and which missing files are recorded as ``ABSENT`` (a header that
    would shadow one found, a ``__has_include`` target). Returns the files that
    changed after the key was computed or the build started (then the build's
    objects may hold other contents than a record or the key would claim: such
    an object is deleted, not recorded), or None if all is well.
    """
    record = load_record(build_dir)
    changed: List[str] = []
    for s in compiled:
        inputs = depfile_inputs(build_dir / (s.obj + ".d"), build_dir, skip_under)
        path = search.get(s.rule) if search else None
        if path is not None:
            keep = set(tracked(inputs, path))
            inputs = [p for p in inputs if p in keep or p in sources]
        # digests first, ctimes after: a file unchanged since the start (by its ctime, read later)
        # still had, when it was digested, the contents the compiler read
        texts = {p: _read(p) for p in inputs}
        digests = {p: (bytes_digest(t) if t is not None else None) for p, t in texts.items()}
        absent: List[str] = []
        found: List[str] = []  # files where the compiler may have looked (and found nothing) before they appeared
        if path is not None:
            headers = [p for p in inputs if p != str(s.source)]
            for c in absent_candidates(str(s.source), headers, path, texts):  # type: ignore[arg-type]
                (absent if _digest(c) == ABSENT else found).append(c)
        late = [p for p in inputs if digests[p] is None or (p in sources and digests[p] != sources[p])]
        late += [p for p in changed_since([*inputs, *found], started_ns) if p not in late]
        if late:
            changed += late
            (build_dir / s.obj).unlink(missing_ok=True)
            continue
        deps = {_IDENTITY: identity, _OBJECT: _digest(str(build_dir / s.obj)) or ""}
        deps.update(digests)  # type: ignore[arg-type]
        deps.update((p, ABSENT) for p in absent)
        record[s.obj] = deps
    write_json_atomic(build_dir / _RECORD, record)
    # a source compiled earlier (its object was current) must also still be what the key says
    changed += [p for p, digest in sources.items() if p not in changed and _digest(p) != digest]
    return changed or None


def changed_since(paths: Sequence[str], started_ns: int) -> List[str]:
    """The files whose ctime is at or after ``started_ns`` (or that are gone): possibly changed
    after a build that started then read them. ctime, unlike mtime, cannot be set back (``touch -d``)."""
    late = []
    for p in paths:
        try:
            ctime = os.stat(p).st_ctime_ns
        except OSError:
            late.append(p)
            continue
        if ctime >= started_ns:
            late.append(p)
    return late


def recorded_inputs(build_dir: Path, objects: Sequence[str], sources: Sequence[Path]) -> Dict[str, str]:
    """Digest of every header the objects were compiled from (sources left out: the base key has them)."""
    record = load_record(build_dir)
    srcs = {str(s) for s in sources}
    out: Dict[str, str] = {}
    for obj in objects:
        for path, digest in record.get(obj, {}).items():
            if path not in (_IDENTITY, _OBJECT) and path not in srcs:
                out[path] = digest
    return out


def prune_old_builds(op_dir: Path, keep: int, current: str) -> None:
    """Keep the ``keep`` most recently used builds of an operator (and their manifests), and
    ``current``; drop the rest. Call with the operator's lock held."""
    builds = []
    with os.scandir(op_dir) as entries:
        for e in entries:
            if e.name in ("build", "deps") or e.name.startswith(".") or not e.is_dir(follow_symlinks=False):
                continue
            builds.append((e.stat(follow_symlinks=False).st_mtime, e.name))
    builds.sort(reverse=True)
    kept_bases = set()
    for i, (_, name) in enumerate(builds):
        d = op_dir / name
        if i < keep or name == current:
            try:
                data = json.loads(read_file(d / INFO))
                kept_bases.add(data.get("base") if isinstance(data, dict) else None)
            except (OSError, ValueError):
                pass
        else:
            shutil.rmtree(d, ignore_errors=True)
    deps = op_dir / "deps"
    if deps.is_dir():
        for m in deps.glob("*.json"):
            if m.stem not in kept_bases:
                m.unlink(missing_ok=True)
