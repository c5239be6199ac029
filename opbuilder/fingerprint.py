"""Cache keys from contents, never from modification times.

The *base key* hashes what is known before compiling: every source's bytes,
flags, backend, kind, compiler identity, Python ABI, pybind11 version and
opbuilder's own headers. The headers a build included are learned from the
compiler's depfiles and kept in a manifest per base key; the *full key* adds
their contents. A warm load computes both from files alone.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

__all__ = ["file_digest", "digest_of", "base_key", "full_key", "manifest_path", "read_manifest",
           "write_json_atomic"]


def file_digest(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.blake2b(f.read(), digest_size=16).hexdigest()


def digest_of(parts: Iterable[str]) -> str:
    h = hashlib.blake2b(digest_size=12)
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()


def base_key(ingredients: Sequence[str], sources: Sequence[Path]) -> str:
    parts = list(ingredients)
    for s in sources:
        parts += [str(s), file_digest(s)]
    return digest_of(parts)


def full_key(base: str, headers: Sequence[str]) -> Optional[str]:
    """``None`` if a recorded header is gone (then the build must run again)."""
    parts = [base]
    for h in sorted(headers):
        try:
            parts += [h, file_digest(Path(h))]
        except OSError:
            return None
    return digest_of(parts)


def manifest_path(op_dir: Path, base: str) -> Path:
    return op_dir / "deps" / f"{base}.json"


def read_manifest(op_dir: Path, base: str) -> Optional[List[str]]:
    try:
        data = json.loads(manifest_path(op_dir, base).read_text())
        return list(data["headers"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_json_atomic(path: Path, data: Dict) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)
