"""Slow facts probed once and remembered in ``<cache>/toolchains.json``.

A compiler's ``--version``, pybind11's version, a digest of opbuilder's own
headers: each is worked out once (a process, an import, reading files) and
stored with the stat stamps (size, mtime, ctime, inode, device) of the files it
came from. While every stamp still matches, the stored fact is reused, so the
warm path runs no process and reads no headers. A stamp only decides whether
to *probe again*; what goes into cache keys is the fact itself (a content
hash, a version line), so ``touch`` costs one re-probe and changes no key.
A fact whose files changed in the last moments before the probe is not
stored: file clocks are coarse (a few ms), so a second edit in the same tick
could leave the stamp as it was. Records are merged into the file under the
cache directory's flock, so processes probing at once keep each other's.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .fingerprint import temp_path

__all__ = ["remembered", "stamp"]

FILE_NAME = "toolchains.json"
SETTLE_NS = 100_000_000  # well over the file clock's tick
_parsed: Dict[str, Tuple[Optional[list], dict]] = {}  # file -> (its stamp, its contents), per process

Facts = Dict[str, object]


def stamp(path: str) -> Optional[List[int]]:
    """(size, mtime, ctime, inode, device) of ``path`` (through symlinks), or None if it does not exist."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def _read(file: str) -> dict:
    st = stamp(file)
    memo = _parsed.get(file)
    if memo is not None and st is not None and memo[0] == st:
        return memo[1]
    try:
        with open(file, "rb") as f:
            data = json.loads(f.read())
        if not isinstance(data, dict):
            data = {}
    except (OSError, ValueError):
        data = {}
    _parsed[file] = (st, data)
    return data


def _settled(stamps: Sequence[Tuple[str, Optional[List[int]]]]) -> bool:
    now = time.time_ns()
    return all(s is None or now - max(s[1], s[2]) > SETTLE_NS for _, s in stamps)


def remembered(state_dir: Optional[Path], lookup: str, probe: Callable[[], Tuple[Facts, List[str]]],
               inputs: Optional[Sequence[str]] = None) -> Facts:
    """The facts for ``lookup``: stored ones while their files' stamps match, else ``probe()``'d.

    ``probe`` returns (facts, the files they were derived from). With no
    ``state_dir`` nothing is stored. ``inputs``, when the probe's files are
    known beforehand, are stamped before it runs too, and the facts are
    stored only if nothing changed meanwhile: a symlink pointed elsewhere
    during the probe leaves its target's times alone, so only this notices.
    """
    file = str(state_dir / FILE_NAME) if state_dir is not None else None
    if file is not None:
        rec = _read(file).get(lookup)
        if isinstance(rec, dict) and isinstance(rec.get("stamps"), list) and "facts" in rec:
            if all(stamp(p) == s for p, s in rec["stamps"]):
                return rec["facts"]
    before = [(p, stamp(p)) for p in inputs] if inputs is not None else None
    facts, paths = probe()
    stamps = [(p, stamp(p)) for p in paths]
    if file is not None and state_dir is not None and _settled(stamps) and (before is None or before == stamps):
        _store(state_dir, file, lookup, {"facts": facts, "stamps": stamps})
    return facts


LOCK_WAIT_S = 10.0  # a probe's record is only a cache: past this, it is not stored


def _store(state_dir: Path, file: str, lookup: str, record: dict) -> None:
    """Add one record to the file: read, merge and replace under the cache directory's lock, so
    processes probing at once do not drop each other's records (the warm path only reads)."""
    from .errors import BuildError
    from .lock import wait_lock

    try:
        with wait_lock(state_dir, LOCK_WAIT_S) as held:
            if held:  # else a stopped process holds it: store nothing rather than wait on it
                _merge(file, lookup, record)
    except BuildError:  # no flock on this file system: merge unlocked (a concurrent probe may lose a record)
        _merge(file, lookup, record)
    except OSError:  # a read-only cache (no lock file) still works, it just probes every time
        pass


def _merge(file: str, lookup: str, record: dict) -> None:
    tmp = str(temp_path(Path(file)))  # one per process and thread: threads write at once too
    try:
        data = dict(_read(file))
        data[lookup] = record
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, file)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
