"""Prebuilt stores: read-only directories of built operators searched before the cache.

``OPBUILDER_PREBUILT_DIR`` lists them (``:``-separated). A store has the
cache's layout for what a lookup reads (``<op>/deps/<base>.json``,
``<op>/<key>/<library>`` and ``build.json`` with the library's size, SHA-256
and stat stamp), plus ``toolchains.json``: the toolchain facts of the cache
that filled it (probe_cache.share), used while their files' stamps match. ``load()`` never writes to one: its
libraries are checked like the cache's (published.py, with the store owner
in place of us, trust.py) and one that fails is ignored with a warning, the
operator then being built into the cache as usual. A store may belong to
another user (root, a CI account) but must be writable by nobody else.

Stores are filled by ``python -m opbuilder build ... --into DIR`` and
``python -m opbuilder import FILE.tar --into DIR`` (``install``), run as the
store's owner: directories 0755, ``build.json`` and manifests 0644,
libraries 0755, each written under a temporary name and renamed into place
(``import`` into a cache uses the cache's modes, 0700 and 0600).
"""
from __future__ import annotations

import json
import os
import re
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

from ..cache.trust import trusted_store

__all__ = ["prebuilt_stores", "ENV", "open_store", "filling", "install", "library_in", "KEY_RE", "OP_RE", "LIB_RE"]

ENV = "OPBUILDER_PREBUILT_DIR"
OP_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.lib)?")  # an operator's directory: NAME or NAME.lib
KEY_RE = re.compile(r"[0-9a-f]{8,64}")  # a key directory, a manifest's base key
LIB_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\.so")  # a library's file name


def prebuilt_stores() -> List[Tuple[Path, int]]:
    """(real path, owner) of each existing store in OPBUILDER_PREBUILT_DIR, in order; one that others
    than its owner can write is an ``UnsafeCacheDirError`` naming it. On the warm path: a few lstats."""
    value = os.environ.get(ENV)
    if not value:
        return []
    out = []
    for entry in value.split(":"):
        if entry:
            store = trusted_store(Path(os.path.expanduser(entry)).absolute())
            if store is not None:
                out.append(store)
    return out


def open_store(directory: Path) -> Path:
    """``directory`` as a store to fill: created (0755) if missing, and ours, writable by nobody else."""
    from ..errors import UnsafeCacheDirError

    directory = directory.expanduser().absolute()
    if not directory.exists():
        os.makedirs(directory, 0o755)
        os.chmod(directory, 0o755)
    store = trusted_store(directory)
    assert store is not None
    if store[1] != os.geteuid():
        raise UnsafeCacheDirError(f"prebuilt store {store[0]} belongs to uid {store[1]}; only its owner may fill it "
                                  f"(run this command as that user)")
    return store[0]


@contextmanager
def filling(directory: Path) -> Iterator[Path]:
    """``open_store(directory)`` for one command that fills it: a store this made (and the directories made
    for it) is removed again, if still empty, when the command fails (an import that imported nothing
    leaves nothing behind)."""
    path = directory.expanduser().absolute()
    made = [d for d in (path, *path.parents) if not d.exists()]  # what open_store creates, deepest first
    store = open_store(directory)
    try:
        yield store
    except BaseException:
        for d in made:
            try:
                os.rmdir(d)  # only an empty directory: whatever was written stays
            except OSError:
                break
        raise


MERGE_LOCK = ".manifest.lock"  # in a store's <op>/deps: held while a fill merges a manifest


def build_layouts(op_dir: Path, key: str, data: dict, owner: Optional[int] = None) -> Optional[List[List[str]]]:
    """The header layouts to record for the build ``op_dir/key`` (``data``: its build.json) where it is
    installed: its own, when build.json records it; else every layout of its manifest (an older build).
    None when that manifest is missing or not one opbuilder wrote."""
    from ..cache.fingerprint import kept_layouts, manifest_layouts, manifest_path

    layouts = kept_layouts(manifest_path(op_dir, data["base"]), owner)
    own = manifest_layouts({"headers": data.get("headers")})
    return layouts if layouts is None or own is None else own


def library_in(key_dir: Path) -> Optional[Path]:
    """The one library in a key directory (its name depends on the Python that built it), or None."""
    libs = [p for p in key_dir.iterdir() if LIB_RE.fullmatch(p.name)]
    return libs[0] if len(libs) == 1 else None


def sha256_of(path: Path) -> str:
    """The SHA-256 of a file, read in 1 MiB blocks."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def install(src_op: Path, key: str, store: Path, src_owner: Optional[int] = None, private: bool = False) -> Path:
    """Copy the build ``key`` of the operator directory ``src_op`` (a cache's, a store's, or an unpacked
    bundle's) into ``store`` (checked, ours: ``open_store``), with its manifest; its stored library.
    Its SHA-256 is computed while copying and must be the one ``build.json`` records (else ValueError
    naming it, and nothing of it is left in the store); the copy's stamp is recorded anew. ``private``:
    into our cache, with its modes (directories and library 0700, records 0600)."""
    from ..cache.fingerprint import kept_layouts, manifest_path, manifest_with
    from ..cache.publish import publish_library
    from ..cache.published import INFO, _library_record
    from ..cache.trust import read_file, write_file

    key_dir = src_op / key
    data = _library_record(key_dir / INFO, src_owner)
    lib = library_in(key_dir)
    if data is None or lib is None or not isinstance(data.get("base"), str) or not KEY_RE.fullmatch(data["base"]):
        raise ValueError(f"{key_dir} is not a build opbuilder published (no library, or no build.json recording "
                         f"its base key, size and SHA-256); nothing of it was stored")
    layouts = build_layouts(src_op, key, data, src_owner)
    if layouts is None:  # a manifest opbuilder did not write is not stored (a lookup would warn about it)
        raise ValueError(f"{manifest_path(src_op, data['base'])} is not a manifest opbuilder wrote; nothing of "
                         f"{key_dir} was stored")
    if sha256_of(lib) != data["library"]["sha256"]:  # before anything is written: a good copy stays
        raise ValueError(f"{lib}: its SHA-256 is not the one its build.json records (changed since it was built); "
                         f"it was not stored")
    from ..cache.trust import make_dir

    dmode, fmode = (0o700, 0o600) if private else (0o755, 0o644)
    dst_op = make_dir(store / src_op.name, dmode)
    dst_key = make_dir(dst_op / key, dmode)
    record = publish_library(lib, dst_key, lib.name, mode=dmode)
    if record["sha256"] != data["library"]["sha256"]:
        (dst_key / lib.name).unlink(missing_ok=True)
        raise ValueError(f"{lib}: its SHA-256 is not the one its build.json records (changed since it was built); "
                         f"it was not stored")
    data["library"] = record
    write_file(dst_key / INFO, json.dumps(data, indent=1, sort_keys=True).encode(), mode=fmode, durable=True)
    make_dir(dst_op / "deps", dmode)
    dst_manifest = manifest_path(dst_op, data["base"])
    # the build's own layout first, then the store's (its other builds stay findable), read and written
    # under a lock: two fills of one store at once keep both (a cache's caller holds its build lock)
    import filelock

    with nullcontext() if private else filelock.FileLock(str(dst_op / "deps" / MERGE_LOCK)):
        merged = manifest_with(layouts, kept_layouts(dst_manifest))
        write_file(dst_manifest, json.dumps(merged, indent=1, sort_keys=True).encode(), mode=fmode, durable=True)
    return dst_key / lib.name
