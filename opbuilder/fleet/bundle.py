"""Bundles: built operators in one tar file, to move them between machines (CI artifact -> cluster).

``export`` writes, for each operator named (a Python identifier: no ``/``,
no ``..``), every intact build in the cache (its library hashed in full
first) with its ``build.json`` and manifest, as ``<op>/<key>/<library>``,
``<op>/<key>/build.json`` and ``<op>/deps/<base>.json``: regular files only,
owned by nobody in particular, into a temporary file renamed over the output
when complete (a failed export leaves the output as it was, and nothing else).
``build.json`` records the C++ compiler the build was keyed with; ``import``
adds those records to the target's ``toolchains.json`` as facts no probe uses
(probe_cache.add_bundled_compilers), so a node with no compiler finds the builds.

``import`` refuses the whole bundle, before writing anything, unless every
member is a regular file or directory with a name of that shape: no ``..``,
no absolute path, no link or device can write outside the target. Members are
unpacked (with tarfile's ``data`` filter as well) into a private temporary
directory; every build must then be whole (library, ``build.json``, manifest)
with the SHA-256 its ``build.json`` records, or nothing is installed; then
each is installed like ``build --into`` does (store.install). A bundle with
no build is an error.
A bundle is trusted as far as whoever made it: import only your own CI's.
"""
from __future__ import annotations

import keyword
import os
import tarfile
import tempfile
from pathlib import Path
from typing import List, Sequence

from .store import KEY_RE, LIB_RE, OP_RE, install, library_in, sha256_of

__all__ = ["export_bundle", "import_bundle"]


def _intact_builds(op_dir: Path) -> List[str]:
    """Keys of the builds in ``op_dir`` whose library has the SHA-256 its build.json records."""
    from ..cache.published import INFO, _library_record, _same_digest

    keys = []
    for d in sorted(op_dir.iterdir()):
        if not KEY_RE.fullmatch(d.name) or d.is_symlink() or not d.is_dir():
            continue
        data = _library_record(d / INFO)
        lib = library_in(d)
        if data is not None and lib is not None and _same_digest(lib, data["library"]["sha256"], "not exported"):
            keys.append(d.name)
    return keys


def _check_names(names: Sequence[str]) -> None:
    """ValueError unless ``names`` is a non-empty list of operator names (what ``build`` accepts: no
    ``/``, no ``..``, nothing that would name a directory outside the cache)."""
    if not names:
        raise ValueError("export needs at least one operator name (python -m opbuilder export NAME... -o FILE.tar)")
    for name in names:
        if not isinstance(name, str) or not OP_RE.fullmatch(name) or name.endswith(".lib") or keyword.iskeyword(name):
            raise ValueError(f"cannot export {name!r}: not an operator name (a Python identifier, as given to "
                             f"'python -m opbuilder build NAME'); nothing was written")


def export_bundle(root: Path, names: Sequence[str], out: Path) -> List[str]:
    """Write the intact builds of ``names`` (modules and ``--library`` builds) from the cache ``root``
    into the tar ``out``; the members written. ValueError if a name is not an operator name or has no
    build. The tar is written beside ``out`` under a temporary name and renamed over it only when
    complete: on any failure ``out`` is as it was and no temporary file is left."""
    import json

    from ..cache.fingerprint import manifest_path
    from ..cache.published import INFO
    from ..cache.trust import check_dir, read_file

    _check_names(names)
    if out.is_dir():
        raise ValueError(f"cannot write the bundle {out}: it is a directory; give a file name (-o {out}/ops.tar); "
                         f"nothing was written")
    if not out.parent.is_dir():
        raise FileNotFoundError(f"cannot write the bundle {out}: its directory {out.parent} does not exist "
                                f"(create it first); nothing was written")
    members: List[str] = []
    files = []
    from ..native.core_lib import CORE_NAME
    from ..native.nanobind_runtime import RUNTIME_NAME
    if any((root / n).is_dir() for n in names):
        # modules bound with nanobind load its shared runtime and the core library: they travel with them
        names = [*names, *(n for n in (RUNTIME_NAME, CORE_NAME) if (root / f"{n}.lib").is_dir())]
    for name in names:
        found = False
        for op in (name, f"{name}.lib"):
            op_dir = root / op
            if not op_dir.is_dir():
                continue
            check_dir(op_dir)
            for key in _intact_builds(op_dir):
                data = json.loads(read_file(op_dir / key / INFO))
                lib = library_in(op_dir / key)
                assert lib is not None
                files += [(lib, f"{op}/{key}/{lib.name}", 0o755), (op_dir / key / INFO, f"{op}/{key}/{INFO}", 0o644),
                          (manifest_path(op_dir, data["base"]), f"{op}/deps/{data['base']}.json", 0o644)]
                found = True
        if not found:
            raise ValueError(f"operator '{name}' has no intact build in {root}; build it first "
                             f"(python -m opbuilder build {name} SOURCE...); nothing was written")

    def plain(info: tarfile.TarInfo, mode: int) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mode = mode
        return info

    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with tarfile.open(tmp, "w") as tar:
            for path, arcname, mode in files:
                if arcname not in members:
                    read_file(path)  # ours, a regular file, not a link (trust.py)
                    tar.add(path, arcname=arcname, recursive=False, filter=lambda i, m=mode: plain(i, m))
                    members.append(arcname)
        os.replace(tmp, out)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return members


def _refusal(bundle: Path, member: tarfile.TarInfo) -> str:
    """Why ``member`` may not be unpacked, or "" if it may."""
    kind = ("a symbolic link" if member.issym() else "a hard link" if member.islnk() else
            None if member.isfile() or member.isdir() else "not a regular file or directory")
    if kind:
        return f"{member.name!r} is {kind}"
    parts = member.name.split("/")
    if member.isdir():
        parts = [p for p in parts if p]
    shapes = (len(parts) in (1, 2) and member.isdir() and OP_RE.fullmatch(parts[0]) is not None
              and (len(parts) == 1 or parts[1] == "deps" or KEY_RE.fullmatch(parts[1]) is not None))
    shapes = shapes or (len(parts) == 3 and member.isfile() and OP_RE.fullmatch(parts[0]) is not None and (
        (parts[1] == "deps" and parts[2].endswith(".json") and KEY_RE.fullmatch(parts[2][:-5]) is not None)
        or (KEY_RE.fullmatch(parts[1]) is not None and (parts[2] == "build.json" or LIB_RE.fullmatch(parts[2])))))
    return "" if shapes else (f"{member.name!r} is not a path opbuilder writes into a bundle "
                              f"(OP/KEY/FILE, OP/deps/BASE.json)")


def import_bundle(bundle: Path, store: Path, cache: bool = False) -> List[Path]:
    """Install every build in the tar ``bundle`` into ``store`` (checked, ours: store.open_store; with
    ``cache``, our cache, under each operator's build lock); the libraries installed. ValueError naming
    the member if the bundle holds anything of another shape (then nothing is written), or a library
    whose SHA-256 is not the one recorded. The compilers the builds record go into the target's
    ``toolchains.json`` (probe_cache.add_bundled_compilers), for nodes that have none."""
    import json
    import shutil

    from ..tools.probe_cache import add_bundled_compilers
    from ..cache.published import INFO

    try:
        tar = tarfile.open(bundle, "r:*")
        members = tar.getmembers()
    except tarfile.TarError as e:
        raise ValueError(f"bundle {bundle} is not a tar file opbuilder can read ({e}; truncated, or not made by "
                         f"'python -m opbuilder export'); nothing was imported") from None
    with tar:
        for m in members:
            why = _refusal(bundle, m)
            if why:
                raise ValueError(f"bundle {bundle} refused, nothing was imported: {why}")
        tmp = Path(tempfile.mkdtemp(prefix="opbuilder-import-"))
        try:
            try:
                tar.extractall(tmp, members=members, filter="data")
            except tarfile.TarError as e:
                raise ValueError(f"bundle {bundle} cannot be unpacked ({e}; truncated?); nothing was imported") \
                    from None
            builds = [(op_dir, key_dir.name) for op_dir in sorted(p for p in tmp.iterdir() if p.is_dir())
                      for key_dir in sorted(p for p in op_dir.iterdir() if p.name != "deps")]
            if not builds:
                raise ValueError(f"bundle {bundle} holds no build (export writes OP/KEY/LIBRARY, build.json and "
                                 f"its manifest); nothing was imported")
            for op_dir, key in builds:  # every build whole and as recorded before any is installed
                why = _incomplete(op_dir, key)
                if why:
                    raise ValueError(f"bundle {bundle} refused, nothing was imported: {op_dir.name}/{key}: {why}")
            libs = [_install(op_dir, key, store, cache) for op_dir, key in builds]
            compilers = [json.loads((op_dir / key / INFO).read_bytes()).get("compiler") for op_dir, key in builds]
            add_bundled_compilers(store, [c for c in compilers if c is not None], 0o600 if cache else 0o644)
            return libs
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _install(op_dir: Path, key: str, target: Path, cache: bool) -> Path:
    """store.install, in a cache under the operator's build lock (a build of it may be publishing or
    pruning), with the cache's modes."""
    if not cache:
        return install(op_dir, key, target)
    from ..cache.lock import build_lock
    from ..cache.trust import make_dir

    name = op_dir.name[:-4] if op_dir.name.endswith(".lib") else op_dir.name
    with build_lock(make_dir(target / op_dir.name), name):
        return install(op_dir, key, target, private=True)


def _incomplete(op_dir: Path, key: str) -> str:
    """Why the unpacked build ``op_dir/key`` cannot be installed (no library, no build.json recording its
    SHA-256, no manifest, or a library that is not the one recorded), or "" if it can."""
    from ..cache.published import INFO, _library_record
    from .store import build_layouts

    key_dir = op_dir / key
    data = _library_record(key_dir / INFO) if (key_dir / INFO).is_file() else None
    lib = library_in(key_dir) if key_dir.is_dir() else None
    if data is None or lib is None:
        return "it has no library or no build.json recording the library's size and SHA-256"
    base = data.get("base")
    if not isinstance(base, str) or not KEY_RE.fullmatch(base):
        return "its build.json records no base key"
    if data.get("compiler") is not None:
        from ..tools.probe_cache import compiler_facts_problem

        why = compiler_facts_problem(data["compiler"])
        if why:
            return f"its build.json: {why}"
    if build_layouts(op_dir, key, data) is None:  # as install reads it, before any build is installed
        return f"its manifest deps/{base}.json is missing, not JSON, or not a manifest opbuilder wrote"
    if sha256_of(lib) != data["library"]["sha256"]:
        return f"{lib.name}: its SHA-256 is not the one its build.json records (changed since it was built)"
    return ""
