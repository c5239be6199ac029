"""Publishing builds atomically, and keeping the object directory honest.

A library is copied to ``<op>/<key>/.name.tmp-PID`` and renamed into place,
so a path that exists is always complete; a published file is never
rewritten (a new key gets a new directory), so processes that loaded it are
safe. Objects are trusted only if a record of their inputs' contents says
they are current: after a crash or an edit, anything else is deleted before
ninja runs, and anything current is marked newer than its inputs, so
``touch`` never causes a recompile.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Dict, Iterable

from .fingerprint import file_digest, write_json_atomic
from .ninja_file import parse_depfile

__all__ = ["publish_library", "invalidate_stale_objects", "record_objects", "prune_old_builds", "KEEP_BUILDS",
           "write_build_info"]

KEEP_BUILDS = 4
_RECORD = "objects.json"
_IDENTITY = "<compile identity>"  # flags, toolchain and opbuilder's headers (not in depfiles: -isystem)


def publish_library(built: Path, key_dir: Path, filename: str) -> Path:
    final = key_dir / filename
    if final.is_file():
        return final
    key_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = key_dir / f".{filename}.tmp-{os.getpid()}"
    shutil.copyfile(built, tmp)
    os.chmod(tmp, 0o700)
    os.replace(tmp, final)
    return final


def write_build_info(key_dir: Path, spec) -> None:
    write_json_atomic(key_dir / "build.json", {
        "name": spec.name, "kind": spec.kind, "backend": spec.backend,
        "sources": [str(s) for s in spec.sources], "built_at": time.time(),
    })


def _load_record(build_dir: Path) -> Dict[str, Dict[str, str]]:
    try:
        data = json.loads((build_dir / _RECORD).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _current(deps: Dict[str, str], identity: str) -> bool:
    if deps.get(_IDENTITY) != identity:
        return False
    for path, digest in deps.items():
        if path == _IDENTITY:
            continue
        try:
            if file_digest(Path(path)) != digest:
                return False
        except OSError:
            return False
    return bool(deps)


def invalidate_stale_objects(build_dir: Path, objects: Iterable[str], identity: str) -> None:
    """Delete objects whose recorded inputs or compile identity changed (or that have no
    record); mark the rest current."""
    record = _load_record(build_dir)
    now = time.time()
    for obj in objects:
        path = build_dir / obj
        if not path.exists():
            continue
        if _current(record.get(obj, {}), identity):
            os.utime(path, (now, now))
        else:
            path.unlink()
            dep = build_dir / (obj + ".d")
            if dep.exists():
                dep.unlink()
    for tmp in build_dir.glob("*.tmp*"):
        tmp.unlink(missing_ok=True)


def record_objects(build_dir: Path, depfiles: Dict[str, Path], identity: str) -> None:
    record = _load_record(build_dir)
    for obj, d in depfiles.items():
        deps = {_IDENTITY: identity}
        for dep in parse_depfile(d):
            p = Path(dep).absolute()
            deps[str(p)] = file_digest(p)
        record[obj] = deps
    write_json_atomic(build_dir / _RECORD, record)


def prune_old_builds(op_dir: Path, keep: int, current: str) -> None:
    """Keep the newest ``keep`` published builds of an operator, drop the rest."""
    builds = []
    for d in op_dir.iterdir():
        if d.is_dir() and d.name not in ("build", "deps") and (d / "build.json").exists():
            builds.append((d.stat().st_mtime, d))
    builds.sort(reverse=True)
    for _, d in builds[keep:]:
        if d.name != current:
            shutil.rmtree(d, ignore_errors=True)
