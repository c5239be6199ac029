"""CustomOpBuilder: sources -> key -> (warm: import) | (cold: lock, ninja, publish) -> module.

The pipeline, one step per module:
  spec.py        validate the arguments
  toolchain.py   compiler identity (probed once, remembered), ninja, pybind11
  fingerprint.py base key from contents; full key adds the headers recorded
                 from the last build's depfiles
  lock.py        per-operator flock; waiters re-check after acquiring it
  ninja_file.py  build.ninja with depfiles; objects kept per operator
  ninja_run.py   run ninja with a progress line; BuildError on failure
  publish.py     copy the library to <op>/<key>/ atomically, record manifests
  importer.py    import it
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Dict, List, Optional, Sequence, Tuple, Union

from . import fingerprint as fp
from . import publish
from .cache_dir import cache_root, ensure_private_dir
from .headers import headers_digest, include_dir
from .importer import import_extension
from .lock import build_lock
from .ninja_file import Step, headers_from_depfiles, object_name, write_build_file
from .ninja_run import run_ninja
from .spec import CUDA_SUFFIXES, BuildSpec, make_spec
from .toolchain import (Compiler, cuda_lib_dir, default_jobs, ext_suffix, find_compiler, find_nvcc, ninja_path,
                        pybind11_info, python_abi, python_include)

__all__ = ["CustomOpBuilder", "build_library"]

log = logging.getLogger("opbuilder")
PathLike = Union[str, os.PathLike]

_loaded: Dict[Tuple[str, str], ModuleType] = {}
_loaded_lock = threading.Lock()


@dataclass(frozen=True)
class _Plan:
    """Everything that decides the binary, as command lines."""

    steps: Tuple[Step, ...]
    output: str
    cxx: Tuple[str, ...]
    cxx_flags: Tuple[str, ...]
    nvcc: Tuple[str, ...]
    cuda_flags: Tuple[str, ...]
    link_flags: Tuple[str, ...]
    identity: Tuple[str, ...]


def _plan(spec: BuildSpec) -> _Plan:
    cxx = find_compiler(spec.root)
    opt = ["-O0", "-g"] if spec.debug else ["-O2"]
    common = ["-isystem", str(include_dir())]
    defines: List[str] = []
    identity = [f"kind={spec.kind}", f"backend={spec.backend}", f"headers={headers_digest()}",
                f"cxx={cxx.identity}"]
    if spec.kind == "module":
        pb_version, pb_include = pybind11_info()
        common += ["-isystem", pb_include, "-isystem", python_include()]
        defines = [f"-DOB_EXTENSION_NAME={spec.name}", f"-DMS_EXTENSION_NAME={spec.name}"]
        identity += [f"pybind11={pb_version}", f"python={python_abi()}"]
        output = spec.name + ext_suffix()
        visibility = ["-fvisibility=hidden"]
    else:
        output = f"lib{spec.name}.so"
        visibility = []
    includes = [f"-I{p}" for p in spec.include_paths]
    cxx_flags = ["-std=c++17", "-fPIC", *opt, *visibility, *defines, *common, *includes, *spec.cflags]
    link = list(spec.ldflags)
    nvcc: Tuple[str, ...] = ()
    cuda_flags: List[str] = []
    steps = []
    for s in spec.sources:
        rule = "cuda" if s.suffix in CUDA_SUFFIXES else "cxx"
        steps.append(Step(s, object_name(s), rule))
    if spec.backend == "GPU":
        nv = find_nvcc(spec.root)
        nvcc = nv.argv
        identity.append(f"nvcc={nv.identity}")
        cuda_flags = ["-std=c++17", "-Xcompiler", "-fPIC", *opt, *defines, *common, *includes,
                      *(["-Xcompiler", "-fvisibility=hidden"] if visibility else []), *spec.cuda_cflags]
        lib = cuda_lib_dir(nv)
        link += ([f"-L{lib}", f"-Wl,-rpath,{lib}"] if lib else []) + ["-lcudart"]
    identity += ["cxx_flags", *cxx_flags, "cuda_flags", *cuda_flags, "link", *link]
    return _Plan(tuple(steps), output, cxx.argv, tuple(cxx_flags), nvcc, tuple(cuda_flags), tuple(link),
                 tuple(identity))


def _lookup(spec: BuildSpec, plan: _Plan, base: str) -> Optional[Tuple[str, Path]]:
    """The published library for the current contents, if there is one."""
    headers = fp.read_manifest(spec.op_dir, base)
    if headers is None:
        return None
    key = fp.full_key(base, headers)
    if key is None:
        return None
    lib = spec.op_dir / key / plan.output
    return (key, lib) if lib.is_file() else None


def _compile(spec: BuildSpec, plan: _Plan, base: str) -> Tuple[str, Path]:
    build_dir = spec.op_dir / "build"
    (build_dir / "obj").mkdir(mode=0o700, parents=True, exist_ok=True)
    write_build_file(build_dir / "build.ninja", plan.steps, plan.output, plan.cxx, plan.cxx_flags, plan.nvcc,
                     plan.cuda_flags, plan.link_flags)
    identity = fp.digest_of(plan.identity)
    publish.invalidate_stale_objects(build_dir, [s.obj for s in plan.steps], identity)
    run_ninja(ninja_path(), build_dir, default_jobs(), spec.name, spec.verbose)
    depfiles = {s.obj: build_dir / (s.obj + ".d") for s in plan.steps}
    headers = headers_from_depfiles(depfiles, spec.sources)
    publish.record_objects(build_dir, depfiles, identity)
    key = fp.full_key(base, headers)
    if key is None:
        raise RuntimeError(f"a header of operator '{spec.name}' disappeared during the build; build again")
    lib = publish.publish_library(build_dir / plan.output, spec.op_dir / key, plan.output)
    fp.write_json_atomic(fp.manifest_path(spec.op_dir, base), {"headers": headers})
    publish.write_build_info(spec.op_dir / key, spec)
    publish.prune_old_builds(spec.op_dir, keep=publish.KEEP_BUILDS, current=key)
    return key, lib


def _build(spec: BuildSpec) -> Tuple[str, Path]:
    """(full key, library path), building if the current contents were never built."""
    ensure_private_dir(spec.root)
    plan = _plan(spec)
    base = fp.base_key(plan.identity, spec.sources)
    hit = _lookup(spec, plan, base)
    if hit is not None:
        return hit
    ensure_private_dir(spec.op_dir)
    with build_lock(spec.op_dir, spec.name):
        hit = _lookup(spec, plan, base)  # another process may have built it meanwhile
        if hit is not None:
            return hit
        return _compile(spec, plan, base)


class CustomOpBuilder:
    """Build C++ (or CUDA) sources into a pybind11 module and load it.

    ``CustomOpBuilder("my_ops", ["ops.cpp"]).load()`` returns the module; the
    first call compiles (seconds), later ones in any process import the cached
    library (milliseconds, no subprocess). Editing a source or a header it
    includes makes the next ``load()`` rebuild and return the new code.
    """

    def __init__(self, name: str, sources: Union[PathLike, Sequence[PathLike]], backend: str = "CPU",
                 include_paths: Optional[Sequence[PathLike]] = None, cflags: Optional[Sequence[str]] = None,
                 ldflags: Optional[Sequence[str]] = None, build_dir: Optional[PathLike] = None,
                 debug_mode: bool = False, verbose: bool = False, **kwargs) -> None:
        cuda_cflags = kwargs.pop("cuda_cflags", None)
        if kwargs:
            raise TypeError(f"CustomOpBuilder got unexpected keyword argument(s) {', '.join(sorted(kwargs))}; "
                            f"accepted: name, sources, backend, include_paths, cflags, ldflags, cuda_cflags, "
                            f"build_dir, debug_mode, verbose")
        verbose = verbose or os.environ.get("OPBUILDER_VERBOSE", "") not in ("", "0")
        self.spec = make_spec(name, sources, backend, "module", include_paths, cflags, cuda_cflags, ldflags,
                              debug_mode, verbose, cache_root(build_dir))
        self.name = name

    def build(self) -> str:
        """Build if needed; the path of the shared library."""
        return str(_build(self.spec)[1])

    def load(self) -> ModuleType:
        """The module for the sources as they are now (the same object if unchanged)."""
        key, lib = _build(self.spec)
        memo = (str(self.spec.op_dir), key)
        with _loaded_lock:
            mod = _loaded.get(memo)
            if mod is None:
                mod = import_extension(self.spec.name, lib)
                _loaded[memo] = mod
        return mod


def build_library(name: str, sources: Union[PathLike, Sequence[PathLike]], backend: str = "CPU",
                  include_paths: Optional[Sequence[PathLike]] = None, cflags: Optional[Sequence[str]] = None,
                  ldflags: Optional[Sequence[str]] = None, build_dir: Optional[PathLike] = None,
                  debug_mode: bool = False, verbose: bool = False,
                  cuda_cflags: Optional[Sequence[str]] = None) -> str:
    """Build a plain shared library (no pybind11, symbols exported), e.g. for aot ops; its path."""
    verbose = verbose or os.environ.get("OPBUILDER_VERBOSE", "") not in ("", "0")
    spec = make_spec(name, sources, backend, "library", include_paths, cflags, cuda_cflags, ldflags, debug_mode,
                     verbose, cache_root(build_dir))
    return str(_build(spec)[1])
