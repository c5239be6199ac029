"""Checking a published build before it is used, and remembering that it was used.

``<op>/<key>/build.json`` records the library's size, SHA-256 and stat stamp
(size, mtime, ctime, inode, device) as published (publish.py). A warm load
checks the key directory and the library without following links
(trust.py), then the size; only if the stamp differs from the record (the
cache was copied or restored, or the file was written to) does it hash the
file, so the usual warm load reads no library bytes. A library that fails is
treated as never built: the caller builds it again and the new file replaces
it. A build without such a record (killed before writing it, or written by
an older opbuilder) is built again too.

Use is remembered in the key directory's mtime, renewed when it is older
than ``USE_STAMP_S``: one ``utime`` every few minutes at most, nothing on the
other warm loads. publish.py keeps the most recently used builds.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import List, Optional, Tuple, Union

from ..errors import warn_broken
from .fingerprint import write_json_atomic
from .trust import check_dir, check_file, read_file, stamp_of

__all__ = ["verified_library", "verified_record", "distrust", "INFO", "USE_STAMP_S"]

INFO = "build.json"
USE_STAMP_S = 600  # a build's last-used stamp is renewed by a load once it is older than this
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
_last: Tuple[str, Optional[dict]] = ("", None)  # the build.json the last verified_library parsed (the cache's)


def _sha256_of(fd: int) -> str:
    import hashlib

    h = hashlib.sha256()
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return h.hexdigest()
        h.update(chunk)


def _library_record(info: Path, owner: Optional[int] = None,
                    then: str = "building the library again") -> Optional[dict]:
    """``build.json``'s parsed contents if it records a library (size, SHA-256, stamp); else None
    (with a warning if it exists but is not what opbuilder writes, saying ``then``: what is done instead)."""
    try:
        data = json.loads(read_file(info, owner))
    except FileNotFoundError:
        return None  # a publish that was killed before its record: built again
    except ValueError as e:
        warn_broken(info, f"not JSON: {e}", then)
        return None
    rec = data.get("library") if isinstance(data, dict) else None
    if not (isinstance(rec, dict) and isinstance(rec.get("size"), int) and isinstance(rec.get("sha256"), str)
            and isinstance(rec.get("stamp"), list)):
        warn_broken(info, "it does not record the library's size and SHA-256", then)
        return None
    return data


def verified_library(key_dir: Path, filename: str, store_owner: Optional[int] = None) -> bool:
    """True if ``key_dir/filename`` is a library as it was published: its size matches its record and,
    unless its stat stamp is the recorded one, its SHA-256 too. Marks the build used (see USE_STAMP_S).

    With ``store_owner`` (a prebuilt store, which load() never writes), entries must be that user's, the
    stamp is compared without its device (a store shared over NFS), nothing is written, and a library
    that fails is ignored with a warning naming it (the operator is then built into the cache)."""
    lib = key_dir / filename
    try:
        dir_st = check_dir(key_dir, store_owner)
        st = check_file(lib, store_owner)
    except FileNotFoundError:
        return False
    info = key_dir / INFO
    stored = "ignoring the prebuilt store's copy and building into the cache"
    data = _library_record(info, store_owner, "building the library again" if store_owner is None else stored)
    if data is None:
        return False
    rec = data["library"]
    then = "building it again (the new file replaces it)" if store_owner is None else f"it is never loaded: {stored}"
    if st.st_size != rec["size"]:
        warn_broken(lib, f"{st.st_size} bytes where {rec['size']} were published", then)
        return False
    stamp = stamp_of(st)
    if store_owner is not None:
        if stamp[:4] == rec["stamp"][:4]:
            return True
        return _same_digest(lib, rec["sha256"], then)
    if stamp != rec["stamp"]:
        fd = os.open(lib, os.O_RDONLY | _NOFOLLOW)
        try:
            digest = _sha256_of(fd)
        finally:
            os.close(fd)
        if digest != rec["sha256"]:
            warn_broken(lib, "its SHA-256 is not the one published", then)
            return False
        rec["stamp"] = stamp_of(st)  # the same bytes (a copied or restored cache): trusted by stamp from now on
        try:
            write_json_atomic(info, data)
        except OSError:
            pass  # a read-only cache: hashed again by the next load
    if time.time() - dir_st.st_mtime > USE_STAMP_S:
        try:
            os.utime(key_dir)
        except OSError:
            pass
    global _last
    _last = (str(info), data)
    return True


def verified_record(key_dir: Union[str, Path]) -> Optional[dict]:
    """The build.json of ``key_dir`` (in the cache) as ``verified_library`` parsed it last in this
    process, so that the warm path that goes on to read it (importer.recorded) reads it once; None if that
    was another build (then the caller reads it)."""
    path, data = _last
    return data if path == os.path.join(key_dir, INFO) else None


def _same_digest(lib: Path, sha256: str, then: str) -> bool:
    fd = os.open(lib, os.O_RDONLY | _NOFOLLOW)
    try:
        digest = _sha256_of(fd)
    finally:
        os.close(fd)
    if digest != sha256:
        warn_broken(lib, "its SHA-256 is not the one recorded when it was stored", then)
    return digest == sha256


def distrust(key_dir: Path, filename: str, stamp: List[int]) -> None:
    """Forget the build in ``key_dir`` if its library still has ``stamp`` (it failed to load):
    its record goes, so the next lookup builds it again. Call with the operator's lock held."""
    try:
        if stamp_of(check_file(key_dir / filename)) != stamp:
            return  # replaced meanwhile by another process
    except FileNotFoundError:
        pass
    (key_dir / INFO).unlink(missing_ok=True)


