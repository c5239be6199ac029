"""The libraries a cached build's record (build.json's ``needs``, written by needs.py) says its module loads
first, each checked with one ``lstat`` against the stamp recorded: what a full lookup (builder.py) and
an import by path alone (a pickle) use. Here, not in importer.py, which every warm and shipped load()
imports and which runs none of it (each module is ~0.3 M instructions of a new process, plus its code:
issues 35, 38); importer.py gives these names too."""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import List, Optional, Sequence

from .importer import DEP_FILES, INSTALLED_KEY, NATIVE_DIR, is_key

__all__ = ["recorded", "recorded_needs"]


def recorded(lib: Path, names: Sequence[str]) -> Optional[List[Path]]:
    """The dependencies recorded for module ``lib`` (in the cache) whose directories are ``names``,
    if every one is there, unchanged since it was recorded; else None (look them up). Only names of
    the libraries opbuilder builds itself are accepted (``DEP_FILES``), so a record can point
    nowhere but at their directories in the same cache."""
    from .cache.published import INFO, verified_record
    from .cache.trust import read_file, stamp_of

    key_dir = str(lib.parent)
    data = verified_record(key_dir)  # parsed by the lookup that found ``lib`` just before
    if data is None:
        import json
        try:
            data = json.loads(read_file(Path(key_dir, INFO)))
        except (OSError, ValueError):
            return None
    entries = data.get("needs") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return None
    root = os.path.dirname(os.path.dirname(key_dir))
    by_dir = {e.get("dir"): e for e in entries if isinstance(e, dict)}
    out = []
    for name in names:
        e = by_dir.get(name)
        if e is None or DEP_FILES.get(name) != e.get("file"):
            return None
        if e.get("key") == INSTALLED_KEY and os.environ.get("OPBUILDER_INSTALLED_RUNTIME", "1") != "0":
            path = f"{NATIVE_DIR}/{e['file']}"
        elif is_key(e.get("key")):
            path = f"{root}/{name}/{e['key']}/{e['file']}"  # plain strings: no Path built per part
        else:
            return None
        try:
            st = os.lstat(path)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode) or stamp_of(st) != e.get("stamp"):
            return None
        out.append(Path(path))
    return out


def recorded_needs(lib: Path) -> List[Path]:
    """Every library the record of module ``lib`` (in the cache) says it loads first, if each is
    there unchanged (``recorded``); else none. For an import by path alone, as a pickle names it."""
    import json

    from .cache.published import INFO
    from .cache.trust import read_file

    try:
        data = json.loads(read_file(lib.parent / INFO))
    except (OSError, ValueError):
        return []
    entries = data.get("needs") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return []
    return recorded(lib, [e.get("dir") for e in entries if isinstance(e, dict)]) or []
