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

A prebuilt store (store.py) holds the records of the cache that filled it
(``share``); a cache without a record uses a store's while its stamps match
(the same machine, or the same files on a shared file system), so a new
cache loading operators from a store starts no process either.

A bundle's builds carry the facts of the C++ compiler that built them
(bundle.py); ``import`` adds them as ``bundled compiler <digest>`` records
(``add_bundled_compilers``). No probe ever looks such a record up, so it never
stands in for a node's own compiler: only a node with no C++ compiler at all
looks builds up with it (toolchain.stored_compilers), and everything else in
those keys (sources, headers, flags, pybind11, Python) is still the node's own.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import UnsafeCacheDirError, warn_broken
from ..cache.trust import read_file, stamp_of, write_file
from ..warm import stamps_unchanged
from ..cache.warm_notes import note_stamps

__all__ = ["remembered", "stamp", "share", "stored_records", "add_bundled_compilers", "compiler_facts_problem",
           "BUNDLED_COMPILER"]

FILE_NAME = "toolchains.json"
BUNDLED_COMPILER = "bundled compiler "  # the lookup prefix of a compiler's facts that came in a bundle
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


def _read(file: str, owner: Optional[int] = None) -> dict:
    """The file's records, parsed once per process while its stamp stays the same. It is checked
    like everything in the cache (ours, or a store's owner's; not a link, written by no one else:
    trust.py), since what it says decides include paths; one that is not a JSON object is treated as
    empty, with a warning."""
    try:
        st = stamp_of(os.lstat(file))
    except FileNotFoundError:
        _parsed.pop(file, None)
        return {}
    memo = _parsed.get(file)
    if memo is not None and memo[0] == st:
        return memo[1]
    try:
        data = json.loads(read_file(Path(file), owner))
    except FileNotFoundError:
        data = {}
    except ValueError as e:
        warn_broken(file, f"not JSON: {e}", "probing the toolchain again")
        data = {}
    if not isinstance(data, dict):
        warn_broken(file, "not a JSON object", "probing the toolchain again")
        data = {}
    _parsed[file] = (st, data)
    return data


def _facts(file: str, lookup: str, rec: object, schema: Dict[str, Any]) -> Optional[Facts]:
    """The facts of a stored record if it has the shape this version writes (else None, with a warning)."""
    if rec is None:
        return None
    ok = (isinstance(rec, dict) and isinstance(rec.get("stamps"), list) and isinstance(rec.get("facts"), dict)
          and all(isinstance(s, list) and len(s) == 2 and isinstance(s[0], str)
                  and (s[1] is None or isinstance(s[1], list)) for s in rec["stamps"])
          and all(isinstance(rec["facts"].get(k), t) for k, t in schema.items()))
    if not ok:
        warn_broken(f"{file} (record {lookup!r})", "not the shape opbuilder writes", "probing it again")
        return None
    return rec["facts"]  # type: ignore[index]


def _settled(stamps: Sequence[Tuple[str, Optional[List[int]]]]) -> bool:
    now = time.time_ns()
    return all(s is None or now - max(s[1], s[2]) > SETTLE_NS for _, s in stamps)


def remembered(state_dir: Optional[Path], lookup: str, probe: Callable[[], Tuple[Facts, List[str]]],
               inputs: Optional[Sequence[str]] = None, schema: Optional[Dict[str, Any]] = None) -> Facts:
    """The facts for ``lookup``: stored ones while their files' stamps match, else ``probe()``'d.

    ``probe`` returns (facts, the files they were derived from). With no
    ``state_dir`` nothing is stored. ``inputs``, when the probe's files are
    known beforehand, are stamped before it runs too, and the facts are
    stored only if nothing changed meanwhile: a symlink pointed elsewhere
    during the probe leaves its target's times alone, so only this notices.
    """
    file = os.path.join(state_dir, FILE_NAME) if state_dir is not None else None  # no Path per lookup
    if file is not None:
        rec = _read(file).get(lookup)
        facts = _facts(file, lookup, rec, schema or {})
        if facts is not None and stamps_unchanged(rec["stamps"]):  # type: ignore[index]
            note_stamps(rec["stamps"])  # type: ignore[index]
            return facts
        facts = _from_stores(lookup, schema or {})
        if facts is not None:
            note_stamps(None)
            return facts
    before = [(p, stamp(p)) for p in inputs] if inputs is not None else None
    facts, paths = probe()
    stamps = [(p, stamp(p)) for p in paths]
    if file is not None and state_dir is not None and _settled(stamps) and (before is None or before == stamps):
        _store(state_dir, file, lookup, {"facts": facts, "stamps": stamps})
        note_stamps(stamps)
    else:
        note_stamps(None)  # a fact no stamp vouches for: the lookup using it leaves no warm record
    return facts


def _from_stores(lookup: str, schema: Dict[str, Any]) -> Optional[Facts]:
    """The facts a prebuilt store recorded for ``lookup``, if their files' stamps match here."""
    from ..fleet.store import prebuilt_stores

    for store, owner in prebuilt_stores():
        file = str(store / FILE_NAME)
        rec = _read(file, owner).get(lookup)
        facts = _facts(file, lookup, rec, schema)
        if facts is not None and stamps_unchanged(rec["stamps"]):  # type: ignore[index]
            return facts
    return None


def stored_records(prefix: str, schema: Dict[str, Any], cache: Optional[Path] = None) -> List[Tuple[str, Facts]]:
    """(lookup, facts) of every well-formed record in the prebuilt stores (and the ``cache``, a checked
    root, first) whose lookup starts with ``prefix``, stamps not checked: for a node that lacks the
    files they came from (builder.py)."""
    from ..fleet.store import prebuilt_stores

    out = []
    for store, owner in ([(cache, None)] if cache is not None else []) + prebuilt_stores():
        file = str(store / FILE_NAME)
        for lookup, rec in _read(file, owner).items():
            facts = _facts(file, lookup, rec, schema) if lookup.startswith(prefix) else None
            if facts is not None:
                out.append((lookup, facts))
    return out


def share(state_dir: Path, store: Path) -> int:
    """Add the cache's records whose stamps still match to the store's file (0644; the store is ours,
    store.open_store), so a cache that loads from the store needs no probe; returns how many."""
    current = {k: r for k, r in _read(str(state_dir / FILE_NAME)).items()
               if _facts(str(state_dir / FILE_NAME), k, r, {}) is not None
               and all(stamp(p) == s for p, s in r["stamps"])}
    if current:
        _merge_records(store, current, 0o644)
    return len(current)


_FAMILIES = ("gcc", "clang", "unknown")  # a C++ compiler's (nvcc's facts have no use without nvcc)


def compiler_facts_problem(facts: object) -> str:
    """Why ``facts`` (a build.json's "compiler") are not a C++ compiler's facts as opbuilder records
    them, or "" if they are: four one-line strings, a known family."""
    if not isinstance(facts, dict) or set(facts) != {"identity", "family", "version", "path"}:
        return "its compiler record is not {identity, family, version, path}"
    for k, v in facts.items():
        if not isinstance(v, str) or not v or len(v) > 4096 or any(ord(c) < 32 or ord(c) == 127 for c in v):
            return f"its compiler record's {k} is not one line of text"
    if facts["family"] not in _FAMILIES:
        return f"its compiler record's family {facts['family']!r} is not one of {', '.join(_FAMILIES)}"
    return ""


def add_bundled_compilers(directory: Path, compilers: Sequence[Facts], mode: int) -> int:
    """Add the C++ compilers' facts that came with a bundle's builds (checked: compiler_facts_problem)
    to ``directory``'s file (a store, ours, or the cache), each under a lookup no probe asks for
    (see the module's docstring); returns how many are new."""
    from ..cache.fingerprint import digest_of

    records = {}
    for facts in compilers:
        assert not compiler_facts_problem(facts), facts
        lookup = BUNDLED_COMPILER + digest_of([str(facts[k]) for k in ("identity", "family", "version", "path")])
        records[lookup] = {"facts": dict(facts), "stamps": []}
    return _merge_records(directory, records, mode)


def _merge_records(directory: Path, records: Dict[str, dict], mode: int) -> int:
    """Merge ``records`` into ``directory``'s file under its lock (so two fillers at once keep each
    other's records; without flock, unlocked), written under a new name and renamed; how many were new."""
    from ..errors import BuildError
    from ..cache.lock import wait_lock

    def merge() -> int:
        file = str(directory / FILE_NAME)
        data = dict(_read(file))
        new = sum(1 for k in records if k not in data)
        data.update(records)
        write_file(Path(file), json.dumps(data, indent=1, sort_keys=True).encode(), mode=mode)
        return new

    if not records:
        return 0
    try:
        with wait_lock(directory, LOCK_WAIT_S * 6):  # held or not (a stopped holder): the facts are written
            return merge()
    except BuildError:  # no flock on this file system
        return merge()


LOCK_WAIT_S = 10.0  # a probe's record is only a cache: past this, it is not stored


def _store(state_dir: Path, file: str, lookup: str, record: dict) -> None:
    """Add one record to the file: read, merge and replace under the cache directory's lock, so
    processes probing at once do not drop each other's records (the warm path only reads)."""
    from ..errors import BuildError, UnsafeCacheDirError
    from ..cache.lock import wait_lock

    try:
        with wait_lock(state_dir, LOCK_WAIT_S) as held:
            if held:  # else a stopped process holds it: store nothing rather than wait on it
                _merge(file, lookup, record)
    except UnsafeCacheDirError:
        raise
    except BuildError:  # no flock on this file system: merge unlocked (a concurrent probe may lose a record)
        _merge(file, lookup, record)
    except OSError:  # a read-only cache (no lock file) still works, it just probes every time
        pass


def _merge(file: str, lookup: str, record: dict) -> None:
    try:
        data = dict(_read(file))
        data[lookup] = record
        write_file(Path(file), json.dumps(data, indent=1, sort_keys=True).encode())
    except UnsafeCacheDirError:
        raise
    except OSError:  # a read-only or full cache: the fact is probed again next time
        pass
