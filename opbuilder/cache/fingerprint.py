"""Cache keys from contents, never from modification times.

The *base key* hashes what is known before compiling: every source's bytes,
flags, backend, kind, compiler identity, Python ABI, pybind11 version and
opbuilder's own headers. The headers a build included are learned from the
compiler's depfiles and kept in a manifest per base key, with the files that
must still be missing (search_path.py); the *full key* adds their contents, or
``ABSENT`` for those not there. A manifest keeps a few such header lists (an
``a.h`` that starts including ``b.h`` is a second one), so the builds of each
stay findable in one cache or store. A warm load computes both from files alone.

Files are named in keys and manifests as relocate.py says: relative to the
operator's project root when under it, so a checkout elsewhere has the same keys.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

from ..errors import warn_broken
from .relocate import portable, resolve
from .trust import read_file, write_file

try:  # the same blake2b that hashlib hands out, without hashlib's OpenSSL import on the warm path
    from _blake2 import blake2b
except ImportError:  # pragma: no cover - other Pythons
    from hashlib import blake2b

__all__ = ["blake2b", "file_digest", "file_state", "bytes_digest", "ABSENT", "digest_of", "source_digests", "base_key",
           "full_key", "current_digests", "manifest_path", "read_manifest", "manifest_layouts", "manifest_with",
           "kept_layouts", "MAX_LAYOUTS", "write_text_atomic", "write_json_atomic"]


ABSENT = "-"  # the state of a file that is not there (search_path.py: files whose creation changes a build)
_MISSING = (FileNotFoundError, NotADirectoryError, IsADirectoryError)  # what the compiler's search skips too


def bytes_digest(data: bytes) -> str:
    return blake2b(data, digest_size=16).hexdigest()


def file_digest(path: Path) -> str:
    with open(path, "rb") as f:
        return bytes_digest(f.read())


def file_state(path: Path) -> Optional[str]:
    """A file's digest, ``ABSENT`` if there is none (nothing there, or a directory), None if it cannot be read."""
    try:
        return file_digest(path)
    except _MISSING:
        return ABSENT
    except OSError:
        return None


def digest_of(parts: Iterable[str]) -> str:
    h = blake2b(digest_size=12)
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()


def source_digests(sources: Sequence[Path]) -> Dict[str, str]:
    """Digest of each source's bytes, by path, in the order given."""
    return {str(s): file_digest(s) for s in sources}


def base_key(ingredients: Sequence[str], sources: Dict[str, str], root: Path) -> str:
    """The key of what is known before compiling: ``ingredients`` and the sources' digests, each
    source named relative to the project ``root`` (relocate.py).

    The builder keeps the digests it hashed here and checks after compiling
    that the sources still have them, so a library is never published under
    contents it was not compiled from.
    """
    parts = list(ingredients)
    for path, digest in sources.items():
        parts += [portable(path, root), digest]
    return digest_of(parts)


def full_key(base: str, header_digests: Dict[str, str]) -> str:
    """The key of a build: its base key plus the contents of the headers it included (by their
    names in the manifest: relocate.portable)."""
    parts = [base]
    for h in sorted(header_digests):
        parts += [h, header_digests[h]]
    return digest_of(parts)


def current_digests(headers: Sequence[str], root: Path) -> Optional[Dict[str, str]]:
    """Digest of each header (named as in a manifest, relative to ``root`` or absolute) as it is now,
    ``ABSENT`` for one that is not there (a header deleted since, or a file recorded as missing: one
    created since gives a digest, so another key); ``None`` if one cannot be read (built again)."""
    out = {}
    for h in headers:
        state = file_state(Path(resolve(h, root)))
        if state is None:
            return None
        out[h] = state
    return out


def manifest_path(op_dir: Path, base: str) -> Path:
    return op_dir / "deps" / f"{base}.json"


def read_manifest(op_dir: Path, base: str, owner: Optional[int] = None) -> Optional[List[List[str]]]:
    """The header lists recorded for ``base``, the latest first: one per layout of headers its builds
    included (``a.h`` that later includes ``b.h`` is a second layout of the same sources; a store or cache
    may hold builds of both). None if there is no manifest, or (with a warning) if it is not one opbuilder
    wrote: then the operator is built again and the manifest rewritten."""
    path = manifest_path(op_dir, base)
    try:
        data = json.loads(read_file(path, owner))
    except FileNotFoundError:
        return None
    except ValueError as e:
        warn_broken(path, f"not JSON: {e}", "building the operator again")
        return None
    layouts = manifest_layouts(data)
    if layouts is None:
        warn_broken(path, 'not {"headers": [paths, absolute or relative to the project], "more": [lists of '
                          'them]}', "building the operator again")
    return layouts


MAX_LAYOUTS = 8  # header layouts one manifest keeps (the oldest go first)


def manifest_layouts(data: object) -> Optional[List[List[str]]]:
    """The header lists of a parsed manifest (``{"headers": [...]}``, with ``"more": [[...], ...]`` when
    builds of other layouts are kept), or None when it is not one."""
    if not isinstance(data, dict):
        return None
    lists = [data.get("headers"), *(data.get("more") or [] if isinstance(data.get("more", []), list) else [None])]
    if not all(isinstance(h, list) and all(isinstance(n, str) and _well_named(n) for n in h) for h in lists):
        return None
    return lists  # type: ignore[return-value]


def manifest_with(layouts: Sequence[Sequence[str]], kept: Optional[Sequence[Sequence[str]]]) -> Dict:
    """The manifest that records ``layouts`` first, then those of ``kept`` (an existing manifest's, or None)
    that differ, at most MAX_LAYOUTS: a build of one layout never hides the builds of another."""
    out: List[List[str]] = []
    for h in [*layouts, *(kept or [])]:
        h = sorted(h)
        if h not in out:
            out.append(h)
    out = out[:MAX_LAYOUTS]
    return {"headers": out[0], **({"more": out[1:]} if len(out) > 1 else {})}


def kept_layouts(path: Path, owner: Optional[int] = None) -> Optional[List[List[str]]]:
    """The layouts of the manifest at ``path`` to keep beside a new one: None, quietly, when there is none
    or it is not one opbuilder wrote (it is replaced)."""
    try:
        return manifest_layouts(json.loads(read_file(path, owner)))
    except (OSError, ValueError):
        return None


def _well_named(name: str) -> bool:
    """An absolute path, or one relative to the project root that stays inside it."""
    return os.path.isabs(name) or (bool(name) and ".." not in name.split("/"))


def write_text_atomic(path: Path, text: str, durable: bool = False) -> None:
    """Write ``path`` (mode 0600) so that readers see the old or the new contents, never a part;
    its directory must exist (and be checked: trust.py)."""
    write_file(path, text.encode(), durable=durable)


def write_json_atomic(path: Path, data: Dict, durable: bool = False) -> None:
    write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True), durable)
