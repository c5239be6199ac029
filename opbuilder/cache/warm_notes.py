"""What a full warm lookup depended on, noted as it runs (warm.py writes it down after).

Its own module, importing nothing of opbuilder when imported: the toolchain's fact cache
(tools/probe_cache.py) and the builder note into it, and ``remember`` writes the record that
warm.py reads (a warm load() imports that module only).
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

__all__ = ["SETTLE_NS", "Seen", "collecting", "note_stamps", "note_lookup", "seen_now", "remember"]

SETTLE_NS = 100_000_000  # well over a file clock's tick (probe_cache.SETTLE_NS)
_local = threading.local()

Stamp = Optional[List[int]]


class Seen:
    """What one full lookup depended on, noted as it ran (per thread)."""

    def __init__(self) -> None:
        self.start_ns = time.time_ns()
        self.stamps: List[Tuple[str, Stamp]] = []
        self.unstamped = False  # a fact used that no stamp vouches for
        self.lookups: dict = {}  # full key -> [(header path, missing)]


class collecting:
    """``with collecting():`` around a full lookup: what it depends on is noted (``note_*``) for
    ``remember``. Nested uses share the outer one."""

    def __enter__(self) -> Optional[Seen]:
        self.outer = getattr(_local, "seen", None)
        if self.outer is None:
            _local.seen = Seen()
        return _local.seen

    def __exit__(self, *exc) -> None:
        if self.outer is None:
            _local.seen = None


def note_stamps(stamps: Optional[Sequence[Sequence]]) -> None:
    """A toolchain fact was used: the (path, stamp) pairs it holds while valid; None: it holds none
    (it was probed and not stored), so nothing about this lookup is remembered."""
    seen = getattr(_local, "seen", None)
    if seen is None:
        return
    if stamps is None:
        seen.unstamped = True
    else:
        seen.stamps += [(str(p), s) for p, s in stamps]


def note_lookup(key: str, headers: Sequence[Tuple[str, bool]]) -> None:
    """The lookup found build ``key`` for the headers of its manifest ((path, missing) each)."""
    seen = getattr(_local, "seen", None)
    if seen is not None:
        seen.lookups[key] = list(headers)


def seen_now() -> Optional[Seen]:
    """What the lookup running in this thread (under ``collecting``) has noted; None outside one."""
    return getattr(_local, "seen", None)


def remember(spec, trusted_spec, key: str, lib: Path, preload_libs: Sequence[Path]) -> None:
    """Write ``spec``'s warm record after the full lookup (under ``collecting``) found ``key``, whose
    library is ``lib`` and loads ``preload_libs`` first; nothing when that lookup built it, or used a
    fact no stamp vouches for, or a file it read changed too recently (see the module's docstring).
    Best effort: a cache that cannot be written is looked up in full next time."""
    from ..warm import _eligible

    seen = seen_now()
    if seen is None or seen.unstamped or key not in seen.lookups or not _eligible(spec):
        return
    try:
        _remember(seen, spec, trusted_spec, key, lib, preload_libs)
    except OSError:
        pass  # a file it cannot stat, a cache it cannot write: looked up in full next time


def _remember(seen, spec, trusted_spec, key: str, lib: Path, preload_libs: Sequence[Path]) -> None:
    import marshal
    import os
    import sys

    from .trust import check_file, stamp_of, write_file
    from ..warm import FORMAT, MAX_RECORDS, _PKG_DIR, _identity, _read_records, _records_path, _stamp

    root = trusted_spec.root
    limit = seen.start_ns - SETTLE_NS
    inputs: dict = {}
    for p in [str(s) for s in trusted_spec.sources]:
        inputs[p] = _stamp(p)
        if inputs[p] is None:
            return
    for p, missing in seen.lookups[key]:
        inputs[p] = _stamp(p)
        if (inputs[p] is None) != missing:
            return
    for p, then in seen.stamps:
        if _stamp(p) != then:
            return
        inputs[p] = then
    for d in os.environ.get("PATH", "").split(os.pathsep):
        if os.path.isabs(d):
            inputs[d] = _stamp(d)  # an entry added or removed moves its directory's stamp
    for m in list(sys.modules.values()):  # opbuilder's own code that ran the lookup: an edit or an upgrade
        f = getattr(m, "__file__", None)  # of it may key builds otherwise, so it is an input too
        if f and getattr(m, "__name__", "").split(".")[0] == "opbuilder" and f.startswith(_PKG_DIR):
            inputs[f] = _stamp(f)
    lib_stamp = stamp_of(check_file(lib))
    pre = [[str(p), stamp_of(os.lstat(p))] for p in preload_libs]
    stamps = [s for s in inputs.values() if s is not None] + [lib_stamp] + [s for _, s in pre]
    if any(max(s[1], s[2]) > limit for s in stamps):
        return  # changed moments before (or during) the lookup: a second edit in the same tick could hide
    identity = _identity(spec)
    path = _records_path(root, spec)
    if str(lib.parent.parent) != os.path.dirname(path):
        return  # not this spec's op dir (a prebuilt store's build)
    record = marshal.dumps((key, lib.name, lib_stamp, [[p, s] for p, s in inputs.items()], pre))
    records = _read_records(path)
    if records.get(identity) == record:
        return
    records.pop(identity, None)
    records[identity] = record  # last: the newest (dicts keep their order)
    while len(records) > MAX_RECORDS:
        del records[next(iter(records))]
    write_file(Path(path), marshal.dumps((FORMAT, records)))
