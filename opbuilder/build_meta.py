"""``opbuilder.build_meta``: a PEP 517 build backend for packages of operators (docs/shipping.md).

A package names it in its ``pyproject.toml``, and lists its operators::

    [build-system]
    requires = ["opbuilder", "hatchling"]
    build-backend = "opbuilder.build_meta"

    [[tool.opbuilder.ops]]
    name = "my_ops"
    sources = ["my_pkg/csrc/ops.cpp"]     # paths from the project's directory, inside the package
    cflags = ["-DFAST"]                   # any CustomOpBuilder option (backend, include_paths, ldflags ...)

It wraps hatchling (``hatchling.build``), which builds the wheel of the package as usual (metadata,
Python files, the sources). Hatchling, not setuptools: opbuilder itself builds with it, so it is in
every environment that has opbuilder's build requirements, it needs no ``setup.py``, and the wheel it
writes is a plain zip that is easy to complete. ``build_wheel`` then compiles each operator with the
builder (``CustomOpBuilder(...).build()``, in a temporary cache) and adds to the wheel, in the
package that holds its sources, ``_opbuilder/<name><suffix>`` and ``opbuilder_ops.json`` (the record
that ``load()`` checks: cache/shipped.py) with its marshal copy ``opbuilder_ops.rec`` (what load() reads,
importer.read_record), and retags it: ``cp312-abi3-<platform>`` on Python >= 3.12
(operators are built against the limited API), ``cp311-cp311-<platform>`` on 3.11. Sdists and
editable installs are hatchling's own (a development install builds on first use).
"""
from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from hatchling import build as _backend

__all__ = ["build_wheel", "build_sdist", "build_editable", "get_requires_for_build_wheel",
           "get_requires_for_build_sdist", "get_requires_for_build_editable", "read_ops", "build_ops"]

OPTIONS = ("backend", "include_paths", "cflags", "ldflags", "cuda_cflags", "debug_mode", "binding", "cuda_arch")
_LISTS = ("include_paths", "cflags", "ldflags", "cuda_cflags")  # each a list of strings (a string is one item)

get_requires_for_build_sdist = _backend.get_requires_for_build_sdist
get_requires_for_build_editable = _backend.get_requires_for_build_editable
build_sdist = _backend.build_sdist
build_editable = _backend.build_editable


def get_requires_for_build_wheel(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    """What building the wheel needs besides opbuilder itself: hatchling's own requirements."""
    return list(_backend.get_requires_for_build_wheel(config_settings))


def read_ops(project: Path) -> List[Dict[str, Any]]:
    """The ``[[tool.opbuilder.ops]]`` entries of ``project``'s pyproject.toml, checked: each has a
    ``name``, ``sources`` (a list of paths in the project) and only CustomOpBuilder's options."""
    import tomllib

    data = tomllib.loads((project / "pyproject.toml").read_text())
    tool = data.get("tool", {})
    section = tool.get("opbuilder", {}) if isinstance(tool, dict) else {}
    ops = section.get("ops", []) if isinstance(section, dict) else None
    if not isinstance(ops, list):
        raise ValueError("[tool.opbuilder] ops must be an array of tables: [[tool.opbuilder.ops]]")
    names = set()
    for op in ops:
        if not isinstance(op, dict) or not isinstance(op.get("name"), str):
            raise ValueError(f"each [[tool.opbuilder.ops]] needs a name: {op!r}")
        if op["name"] in names:  # one binary and one record entry per name: the second would replace the first
            raise ValueError(f"operator '{op['name']}' is listed twice in [[tool.opbuilder.ops]]; give each "
                             f"operator its own name")
        names.add(op["name"])
        srcs = op.get("sources")
        if isinstance(srcs, str):
            op["sources"] = srcs = [srcs]
        if not isinstance(srcs, list) or not srcs or not all(isinstance(s, str) for s in srcs):
            raise ValueError(f"operator '{op['name']}' in [[tool.opbuilder.ops]]: sources must be a list of paths")
        unknown = sorted(set(op) - {"name", "sources", *OPTIONS})
        if unknown:
            raise ValueError(f"operator '{op['name']}' in [[tool.opbuilder.ops]]: unknown option(s) "
                             f"{', '.join(unknown)}; accepted: name, sources, {', '.join(OPTIONS)}")
        for key in _LISTS:  # a string would be taken a character at a time
            if isinstance(op.get(key), str):
                op[key] = [op[key]]
            if key in op and not (isinstance(op[key], list) and all(isinstance(v, str) for v in op[key])):
                raise ValueError(f"operator '{op['name']}' in [[tool.opbuilder.ops]]: {key} must be a list of "
                                 f"strings, got {op[key]!r}")
        if "debug_mode" in op and not isinstance(op["debug_mode"], bool):
            raise ValueError(f"operator '{op['name']}' in [[tool.opbuilder.ops]]: debug_mode must be true or "
                             f"false, got {op['debug_mode']!r}")
    return ops


def _package_dir(project: Path, op: Dict[str, Any]) -> Path:
    """The top-level package that holds every source of ``op`` (where its binary and record go)."""
    tops = set()
    for s in op["sources"]:
        rel = Path(os.path.normpath(s))
        if rel.is_absolute() or rel.parts[0] == ".." or len(rel.parts) < 2:
            raise ValueError(f"operator '{op['name']}': source {s!r} must be a path inside a package of the project")
        tops.add(rel.parts[0])
    if len(tops) != 1:
        raise ValueError(f"operator '{op['name']}': its sources are in several packages ({', '.join(sorted(tops))})")
    return project / tops.pop()


def build_ops(project: Path, out: Path) -> Tuple[Dict[str, bytes], str]:
    """Compile the operators of ``project`` (read_ops); the files to add to the wheel (path in the
    wheel -> bytes) and the wheel tag they need."""
    with _no_background_pch():
        return _build_ops(project, out)


@contextlib.contextmanager
def _no_background_pch() -> Iterator[None]:
    """OPBUILDER_PCH=0 while the operators build: a cache's first build starts a detached process that
    precompiles the header for later builds, and this cache is a temporary directory deleted with the
    wheel's work (the process still writing there failed the deletion, or left the directory behind)."""
    prior = os.environ.get("OPBUILDER_PCH")
    os.environ["OPBUILDER_PCH"] = "0"
    try:
        yield
    finally:
        if prior is None:
            os.environ.pop("OPBUILDER_PCH", None)
        else:
            os.environ["OPBUILDER_PCH"] = prior


def _build_ops(project: Path, out: Path) -> Tuple[Dict[str, bytes], str]:
    from . import builder as B
    from .cache.file_hash import HASH
    from .cache.publish import load_record, recorded_inputs
    from .cache.shipped import BIN_DIR, RECORD, record_copy, record_entry, shipped_binary
    from .compile.binding import NANOBIND
    from . import CustomOpBuilder
    from .native.abi import cxx_abi, wheel_tag
    from .native.core_lib import uses_core
    from .native.installed import current_abi
    from .tools.toolchain import find_compiler, python_abi

    ops = read_ops(project)
    records: Dict[Path, Dict[str, Any]] = {}
    files: Dict[str, bytes] = {}
    tag = wheel_tag()
    cache = out / "cache"
    cache.mkdir(mode=0o700, exist_ok=True)
    for op in ops:
        top = _package_dir(project, op)
        kwargs = {k: op[k] for k in OPTIONS if k in op}
        if "include_paths" in kwargs:
            kwargs["include_paths"] = [str(project / p) for p in kwargs["include_paths"]]
        b = CustomOpBuilder(op["name"], [str(project / s) for s in op["sources"]], build_dir=str(cache), **kwargs)
        lib = shipped_binary(Path(b.build()), out, b.spec.debug)  # without its symbol table: less to hash
        spec = B._bound(b.spec).spec
        nanobind = spec.binding == NANOBIND
        if nanobind:
            abi = current_abi(cxx_abi(find_compiler(spec.root), spec.root), spec.root)
        else:  # pybind11: the full API of this Python (its own runtime is in the binary)
            abi = {"python": python_abi(), "binding": "pybind11"}
            py = f"cp{sys.version_info[0]}{sys.version_info[1]}"
            tag = f"{py}-{py}-" + tag.split("-", 2)[2]
        # b.spec: as load() sees it at run time (the binding as given, not as read from the sources)
        # what the compiler read (the build's record of its objects' inputs): in the key whatever the names
        build_dir = Path(spec.op_dir) / "build"
        read = recorded_inputs(build_dir, list(load_record(build_dir)), spec.sources)
        entry = record_entry(b.spec, top, f"{BIN_DIR}/{lib.name}", lib, abi, nanobind and uses_core(spec), read)
        files[f"{top.name}/{BIN_DIR}/{lib.name}"] = lib.read_bytes()
        records.setdefault(top, {"format": 1, "hash": HASH, "ops": {}})["ops"][op["name"]] = entry
        for s in op["sources"]:
            files[Path(os.path.normpath(s)).as_posix()] = (project / s).read_bytes()
        for h in entry["headers"] or {}:  # the headers its key covers travel with it (cache/shipped.py)
            files[f"{top.name}/{h}"] = (top / h).read_bytes()
    for top, record in records.items():  # the JSON, and its marshal copy that load() reads (importer.read_record)
        files[f"{top.name}/{RECORD}"] = (json.dumps(record, indent=1, sort_keys=True) + "\n").encode()
        files[f"{top.name}/{RECORD[:-len('json')]}rec"] = record_copy(record)
    return files, tag


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _complete(wheel: Path, files: Dict[str, bytes], tag: str, dest: Path) -> Path:
    """``wheel`` with ``files`` added (replacing any of the same name), platform-specific and tagged
    ``tag``, written to ``dest``; its path."""
    name, version = wheel.name.split("-")[:2]
    out = dest / f"{name}-{version}-{tag}.whl"
    with zipfile.ZipFile(wheel) as zin:
        entries = [(i, zin.read(i)) for i in zin.infolist() if i.filename not in files]
    record_name = next(i.filename for i, _ in entries if i.filename.endswith(".dist-info/RECORD"))
    dist_info = record_name.rsplit("/", 1)[0]
    lines = []
    tmp = out.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
        for info, data in entries:
            if info.filename == record_name:
                continue
            if info.filename == f"{dist_info}/WHEEL":
                kept = [ln for ln in data.decode().splitlines() if not ln.startswith(("Tag:", "Root-Is-Purelib:"))]
                data = "\n".join(kept + ["Root-Is-Purelib: false", f"Tag: {tag}", ""]).encode()
            zout.writestr(info, data)
            lines.append(_record_line(info.filename, data))
        for path, data in sorted(files.items()):
            info = zipfile.ZipInfo(path, date_time=(2020, 2, 2, 0, 0, 0))
            info.external_attr = (0o755 if path.endswith(".so") else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zout.writestr(info, data)
            lines.append(_record_line(path, data))
        lines.append(f"{record_name},,")
        zout.writestr(zipfile.ZipInfo(record_name, date_time=(2020, 2, 2, 0, 0, 0)), "\n".join(lines) + "\n")
    os.replace(tmp, out)
    return out


def build_wheel(wheel_directory: str, config_settings: Optional[Dict[str, Any]] = None,
                metadata_directory: Optional[str] = None) -> str:
    """The package's wheel (hatchling's) with its operators compiled into it; its file name."""
    project = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="opbuilder-wheel-") as tmp:
        work = Path(tmp)
        plain = work / "plain"
        plain.mkdir()
        name = _backend.build_wheel(str(plain), config_settings, metadata_directory)
        files, tag = build_ops(project, work)
        if not files:
            shutil.copyfile(plain / name, Path(wheel_directory) / name)
            return name
        return _complete(plain / name, files, tag, Path(wheel_directory)).name
