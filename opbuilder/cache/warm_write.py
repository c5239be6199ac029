"""A warm record written after a full lookup (warm.py reads it): what the lookup depended on, as
warm_notes.py noted it, with each input's stamp. Imported by the builder, never by a warm load().
"""
from __future__ import annotations

import marshal
import os
import sys
from pathlib import Path
from typing import Sequence

from ..warm import FORMAT, MAX_RECORDS, _PKG_DIR, _identity, _read_records, _records_path, _stamp, stamps_data
from .trust import check_file, stamp_of, write_file
from .warm_notes import SETTLE_NS, seen_now

__all__ = ["remember"]


def remember(spec, trusted_spec, key: str, lib: Path, preload_libs: Sequence[Path]) -> None:
    """Write ``spec``'s warm record after the full lookup (under ``collecting``) found ``key``, whose
    library is ``lib`` and loads ``preload_libs`` first; nothing when that lookup built it, or used a
    fact no stamp vouches for, or a file it read changed too recently (see the module's docstring).
    Best effort: a cache that cannot be written is looked up in full next time."""
    seen = seen_now()
    if seen is None or seen.unstamped or key not in seen.lookups or not spec.warm_record_fits():
        return
    try:
        _remember(seen, spec, trusted_spec, key, lib, preload_libs)
    except OSError:
        pass  # a file it cannot stat, a cache it cannot write: looked up in full next time


def _remember(seen, spec, trusted_spec, key: str, lib: Path, preload_libs: Sequence[Path]) -> None:
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
    # the inputs: their paths joined by NULs (no path holds one) and their stamps as one string (warm.py)
    record = marshal.dumps((key, lib.name, lib_stamp, ("\0".join(inputs), stamps_data(list(inputs.values()))), pre))
    records = _read_records(path)
    if records.get(identity) == record:
        return
    records.pop(identity, None)
    records[identity] = record  # last: the newest (dicts keep their order)
    while len(records) > MAX_RECORDS:
        del records[next(iter(records))]
    write_file(Path(path), marshal.dumps((FORMAT, records)))
