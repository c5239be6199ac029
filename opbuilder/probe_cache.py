"""Slow facts probed once and remembered in ``<cache>/toolchains.json``.

A compiler's ``--version``, pybind11's version, a digest of opbuilder's own
headers: each is worked out once (a process, an import, reading files) and
stored with the stat stamps (size, mtime, ctime, inode) of the files it came
from. While every stamp still matches, the stored fact is reused, so the
warm path runs no process and reads no headers. A stamp only decides whether
to *probe again*; what goes into cache keys is the fact itself (a content
hash, a version line), so ``touch`` costs one re-probe and changes no key.
A fact whose files changed in the last moments before the probe is not
stored: file clocks are coarse (a few ms), so a second edit in the same tick
could leave the stamp as it was.
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
    """(size, mtime, ctime, inode) of ``path``, or None if it does not exist."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


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


def remembered(state_dir: Optional[Path], lookup: str, probe: Callable[[], Tuple[Facts, List[str]]]) -> Facts:
    """The facts for ``lookup``: stored ones while their files' stamps match, else ``probe()``'d.

    ``probe`` returns (facts, the files they were derived from). With no
    ``state_dir`` nothing is stored.
    """
    file = str(state_dir / FILE_NAME) if state_dir is not None else None
    if file is not None:
        rec = _read(file).get(lookup)
        if isinstance(rec, dict) and isinstance(rec.get("stamps"), list) and "facts" in rec:
            if all(stamp(p) == s for p, s in rec["stamps"]):
                return rec["facts"]
    facts, paths = probe()
    stamps = [(p, stamp(p)) for p in paths]
    if file is not None and state_dir is not None and _settled(stamps):
        _store(state_dir, file, lookup, {"facts": facts, "stamps": stamps})
    return facts


def _store(state_dir: Path, file: str, lookup: str, record: dict) -> None:
    """Add one record to the file: read, merge and replace under the cache directory's lock, so
    processes probing at once do not drop each other's records (the warm path only reads)."""
    from .errors import BuildError
    from .lock import wait_lock

    tmp = str(temp_path(Path(file)))  # one per process and thread: threads write at once too
    try:
        with wait_lock(state_dir):
            data = dict(_read(file))
            data[lookup] = record
            with open(tmp, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, file)
    except BuildError:  # no flock on this file system: store nothing; the build's lock says so, naming the op
        pass
    except OSError:  # a read-only cache still works, it just probes every time
        try:
            os.unlink(tmp)
        except OSError:
            pass
