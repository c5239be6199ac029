"""CustomOpBuilder: sources -> key -> (warm: import) | (cold: lock, ninja, publish) -> module.

The pipeline, one step per module (docs/reference/builder.md walks it):
  spec.py                 validate the arguments
  tools/toolchain.py      compiler identity, pybind11, Python (probed once, remembered by tools/probe_cache.py)
  cache/fingerprint.py    base key from contents; full key adds the headers recorded from the last build
  compile/search_path.py  which headers are tracked, and which missing files would change the build
  cache/lock.py           per-operator flock; waiters re-check after acquiring it
  native/pch.py           the precompiled opbuilder/extension.h, built once per toolchain and flags
                          by a detached low-priority process
  compile/ninja_file.py   build.ninja for what is stale; objects kept per operator
  compile/ninja_run.py    run ninja with a progress line; clean up after a killed build
  cache/publish.py        object records, copy the library to <op>/<key>/ atomically, prune
  importer.py             import it
  retry.py                the one retry loop around a pass of the above, its reasons and its bound

The warm path (everything up to ``_lookup``) imports nothing slow and starts
no process; the cold path's modules are imported when it first runs.
"""
from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

from .cache import fingerprint as fp
from .cache import warm_notes
from .cache.warm_write import remember as remember_warm
from .cache.cache_dir import cache_root, root_origin
from .cache.published import verified_library
from .cache.relocate import portable, prefix_map_flags, project_root, resolve
from .cache.shipped import refuse_build
from .cache.trust import check_dir, read_file, stamp_of, trusted_root
from .compile.binding import NANOBIND, PYBIND11, RECORD, binding_and_digests, detect_binding, from_pybind11
from .compile.target import Target as _Target
from .native.abi import api_flags, cxx_abi, module_suffix, python_api
from .native.core_lib import CORE_FILE, check_layout_flags, core_tag, uses_core
from .errors import BuildError, ToolchainError, UnsafeCacheDirError, cache_os_error
from .fleet.store import prebuilt_stores
from .native.headers import copy_read, headers_digest, include_dir, shadowing_copy
from .import_errors import loader_error
from .importer import RUNTIME_NAME, import_extension, loaded_runtime, module_name_for, preload
from .importer import recorded as recorded_deps
# (op dir, key) -> module and the module names used, in this process: shared with warm.py's load
from .importer import loaded_lock as _loaded_lock, loaded_modules as _loaded, names_used as _names_used
from .retry import Reason, Retry, retrying
from .spec import (CUDA_SUFFIXES, CXX_SUFFIXES, PATH_FLAGS, BuildSpec, joined_path_flag, make_spec, switch_on,
                   verbose_requested)
from .tools.launcher import launcher_is_sccache, launcher_requested
from .tools.toolchain import (INCLUDE_ENV, Compiler, compiler_env, ext_suffix, find_compiler, find_nvcc,
                              links_with_lto, nanobind_info, native_cpu, python_headers, python_info,
                              wants_native_cpu)
from .native.torch_bridge_build import KIND as BRIDGE_KIND, bridge_target

__all__ = ["build_library", "build_module", "load_module", "installed_pch_key"]

PathLike = Union[str, os.PathLike]

GCC_GC_HEAP_KB = 512 * 1024  # gcc collects no garbage below this heap size (its default: 128 MB)


class _Plan(NamedTuple):
    """Everything that decides the binary, as command-line pieces, and its identity for keys. NamedTuples,
    not dataclasses, here and below: dataclass creation at import costs a warm load() a gen-1 collection."""

    sources: Tuple[Path, ...]
    objects: Tuple[str, ...]  # per source: its object, relative to the build directory
    rules: Tuple[str, ...]  # per source: "cxx" or "cuda"
    output: str  # the library's file name
    cxx: Compiler
    flags: Tuple[str, ...]  # C++ compile flags, -I of the include paths apart
    includes: Tuple[str, ...]  # -I of the include paths
    nvcc: Optional[Compiler]
    cuda_flags: Tuple[str, ...]
    link_flags: Tuple[str, ...]
    identity: Tuple[str, ...]  # what the base key hashes besides the sources' contents
    pch_parts: Tuple[str, ...]  # the precompiled header's identity; () when there is none
    pch_flags: Tuple[str, ...]
    project: Path
    places: Tuple[Tuple[str, str], ...]  # toolchain include directories and their names (for _path_maps)
    toolchain_dirs: Tuple[str, ...]  # include directories keyed by what they are, not by their headers
    binding: Optional[str]  # NANOBIND, PYBIND11, or None for what is not a Python module


class Built(NamedTuple):
    """One build ready to use: the trusted spec it was built for, its full key and its library."""

    spec: BuildSpec
    key: str
    library: Path

    @property
    def in_cache(self) -> bool:
        """The library is in the cache (``<op_dir>/<key>/``), not in a read-only prebuilt store: only
        the cache's builds get a record of what they load first, or are forgotten when rejected."""
        return self.library.parent.parent == self.spec.op_dir


class ModuleBuild(NamedTuple):
    """A module's build and the shared libraries to load, in order, before it is imported (nanobind's
    runtime and the core library; none for a pybind11 module)."""

    preload: List[Path]
    built: Built


class _Bound(NamedTuple):
    """A module's spec, trusted, with its binding decided: ``detected`` when it was read from the sources
    (``digests``: their digests, read at the same time), not given as ``binding=``."""

    spec: BuildSpec
    detected: bool
    digests: Optional[Dict[str, str]]


def _object_name(source: Path) -> str:
    """The object of one source: its stem plus a hash of its absolute path (two ops.cpp in different
    folders; two checkouts of one project, whose objects are recorded with their own inputs)."""
    return f"obj/{source.stem}-{fp.digest_of([str(source)])[:8]}.o"


def _key_flags(flags: Sequence[str], places: Dict[str, str], project: Path) -> List[str]:
    """``flags`` as keys see them: the toolchain's include directories by what they are (their contents
    are keyed by version and digest), paths in the project (``-I``, ``-isystem``, ``-L`` ..., joined or
    separate) by their paths in it (relocate.py)."""
    out = []
    for i, f in enumerate(flags):
        if f in places:
            out.append(places[f])
        elif i > 0 and flags[i - 1] in PATH_FLAGS:
            out.append(portable(f, project))
        else:
            flag = joined_path_flag(f)
            out.append(f if flag is None else flag + portable(f[len(flag):], project))
    return out


def _key_env(env: Sequence[str], project: Path) -> List[str]:
    """``NAME=value`` entries of the compiler's environment as keys see them: each absolute path in a
    path list relative to the project when it is in it (relocate.py), like a flag's."""
    out = []
    for entry in env:
        name, _, value = entry.partition("=")
        parts = value.split(os.pathsep) if name in _PATH_ENV else [value]
        out.append(f"env:{name}=" + os.pathsep.join(portable(p, project) if os.path.isabs(p) else p for p in parts))
    return out


_PATH_ENV = frozenset((*INCLUDE_ENV, "COMPILER_PATH", "LIBRARY_PATH", "LD_RUN_PATH"))


def _lto_enabled() -> bool:
    return switch_on("OPBUILDER_LTO", "1")


def _optimization(spec: BuildSpec, cxx: Compiler) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """(-O flags, which nvcc gets too; gcc's flags for speed, of the code or of the compile)."""
    # gcc only, and changing no generated code: the assembler reads from a pipe as cc1plus writes, and
    # the garbage collector waits until 512 MB are in use (by default it runs from 128 MB, ~5% of a
    # pybind11 module's compile); together ~0.6 s of a ~10 s cold build
    speed = ("-pipe", "--param", f"ggc-min-heapsize={GCC_GC_HEAP_KB}") if cxx.family == "gcc" else ()
    if spec.kind == "runtime" and not spec.debug:
        from .native.nanobind_runtime import RUNTIME_OPT
        return (RUNTIME_OPT,), speed  # -Os, as nanobind's CMake builds it (nanobind_runtime.py)
    opt = ("-O0", "-g") if spec.debug else ("-O2",)
    # gcc only (not nvcc): -O2 with the loop vectorizer -O3 uses; gcc 12's -O2 model skips loops whose
    # trip count is unknown (a plain elementwise kernel ran ~4x slower); older gcc does not vectorize at -O2
    vectorize = ("-ftree-vectorize", "-fvect-cost-model=dynamic") if not spec.debug and cxx.family == "gcc" else ()
    return opt, vectorize + speed


def _core_defines(hdr: str, cxx_lib: str, abi: str) -> Tuple[str, ...]:
    """An operator's defines for the core library: its tag, and (libstdc++) the dual-ABI choice it was
    built with, which detail/core_lib.h compares with the source's own (a ``#define`` in it)."""
    cxx11 = cxx_lib.split("cxx11-abi=")[1][:1] if cxx_lib.startswith("libstdc++ cxx11-abi=") else ""
    return (f"-DOB_CORE_TAG={core_tag(hdr, cxx_lib, abi)}",) + ((f"-DOB_CORE_CXX11_ABI={cxx11}",) if cxx11 else ())


# A module's calls to CPython's GIL release and check go to include/opbuilder/detail/gil_wrap.h's
# wrappers: a release inside an XLA FFI run (to_jax runs a module function on XLA's thread, without the
# GIL) does nothing, where CPython aborts the process.
_GIL_WRAP = "-Wl,--wrap=PyEval_SaveThread,--wrap=PyEval_RestoreThread,--wrap=PyGILState_Check"


def _module_target(spec: BuildSpec, hdr: str, cxx: Compiler) -> _Target:
    """A Python module, bound with nanobind (its runtime is a shared library built once per toolchain,
    nanobind_runtime.py, and the core's non-template functions come from the core library,
    core_lib.py) or with pybind11."""
    names = (f"-DOB_EXTENSION_NAME={spec.name}", f"-DMS_EXTENSION_NAME={spec.name}")
    output = spec.name + ext_suffix()
    # a C++ source gets the wrappers' definitions (_compile_steps); a module of CUDA sources only lacks them
    link = (_GIL_WRAP,) if sys.platform.startswith("linux") and any(
        s.suffix in CXX_SUFFIXES for s in spec.sources) else ()
    if _binding(spec, recorded=True) == NANOBIND:
        nb = nanobind_info(spec.root)
        python_include, _ = python_headers(spec.root)  # nothing of pybind11 (python_info) is looked up
        abi = python_api()  # the limited API on >= 3.12 (native/abi.py)
        core = _core_defines(hdr, cxx_abi(cxx, spec.root), abi) if uses_core(spec) else ()
        binding_defines = ("-DOB_BINDING_NANOBIND", "-DNB_SHARED", *api_flags(), *core)
        keys = (f"nanobind={nb.version}", f"python={abi}")
        output = spec.name + module_suffix()
        # its own PCH: with the core in the core library, reading the headers is ~30% of the compile
        return _Target(output, NANOBIND, ("-isystem", nb.include, "-isystem", python_include),
                       ((nb.include, "<nanobind include>"), (python_include, "<python include>")),
                       names + binding_defines, binding_defines, ("-fvisibility=hidden",),
                       ("binding=nanobind", *keys), pch_identity=keys, link=link)
    py = python_info(spec.root)
    keys = (f"pybind11={py.pybind11_version}", f"python={py.abi}")
    return _Target(output, PYBIND11, ("-isystem", py.pybind11_include, "-isystem", py.python_include),
                   ((py.pybind11_include, "<pybind11 include>"), (py.python_include, "<python include>")),
                   names, (), ("-fvisibility=hidden",), keys, pch_identity=keys, link=link)


def _runtime_target(spec: BuildSpec) -> _Target:
    """nanobind's runtime (nb_combined.cpp), as nanobind's CMake builds it."""
    py = python_info(spec.root)
    nb = nanobind_info(spec.root)
    # nanobind's own sources (nb_combined.cpp includes them) are keyed by its version, like its
    # headers: a warm lookup hashes none of their ~350 KB; opbuilder's headers are not read
    return _Target("libnanobind.so", None,
                   ("-isystem", py.python_include, "-isystem", nb.include, "-isystem", nb.robin_map),
                   ((py.python_include, "<python include>"), (nb.include, "<nanobind include>"),
                    (nb.robin_map, "<robin_map include>"), (nb.source, "<nanobind source>")),
                   visibility=("-fvisibility=hidden", "-fno-strict-aliasing", "-DNB_BUILD", "-DNB_SHARED",
                               "-DNB_COMPACT_ASSERTIONS", *api_flags()),
                   identity=(f"nanobind={nb.version}", f"python={python_api()}", "nanobind_sources=by-version"),
                   reads_headers=False)


def _core_target(spec: BuildSpec, hdr: str, cxx: Compiler) -> _Target:
    """The core library (core_lib.cpp): opbuilder's headers over Python's C API, compiled once."""
    py = python_info(spec.root)
    # -fno-semantic-interposition: its exported functions call (and inline) each other directly, not
    # through the PLT (the tag in their names already rules out interposing them)
    return _Target(CORE_FILE, None, ("-isystem", py.python_include), ((py.python_include, "<python include>"),),
                   visibility=("-fvisibility=hidden", "-fno-semantic-interposition", "-DOB_CORE_BUILD",
                               f"-DOB_CORE_TAG={core_tag(hdr, cxx_abi(cxx, spec.root), python_api())}",
                               *api_flags()),
                   identity=(f"python={python_api()}",))


def _target(spec: BuildSpec, hdr: str, cxx: Compiler) -> _Target:
    """What ``spec``'s kind of output adds to its plan; a plain library (aot ops) adds nothing."""
    if spec.kind == "module":
        return _module_target(spec, hdr, cxx)
    if spec.kind == "runtime":
        return _runtime_target(spec)
    if spec.kind == "core":
        return _core_target(spec, hdr, cxx)
    if spec.kind == BRIDGE_KIND:  # to_torch's C++ bridge: its flags are torch's (torch_bridge_build.py)
        return bridge_target(spec)
    return _Target(f"lib{spec.name}.so")


def _use_lto(spec: BuildSpec, target: _Target, cxx: Compiler) -> bool:
    """Link-time optimization, for one-source gcc-built pybind11 modules.

    The compile step stops before code generation and the link runs it in parallel partitions, so a
    single source uses every core (~25% less wall time on 2 cores; pybind11's own CMake also links
    modules with LTO). Not with several sources: ninja compiles those in parallel already, and an LTO
    relink would generate code for every object again, making a one-file incremental rebuild cost a
    full one. Nor with a compiler launcher: sccache and ccache cache compiles, never links, and with
    LTO the link is where the code is generated, so every machine would still generate it (measured: a
    second machine 0.36x of the first's cold build with LTO, 0.03x without).
    Not for a nanobind module either: its one small TU has too little code to split, so the link
    generated it on one core anyway and LTO only added the intermediate form's write and read
    (README operator, runtime built, 2 cores, 3 interleaved rounds: 4.34 s wall / 3.52 s CPU with,
    3.36 s / 3.29 s without; its call overhead is the same either way, within noise).
    Nor for nanobind's runtime: it compiles beside the operator and the core library on a newcomer's
    first load(), when the cores are busy anyway, and at -Os LTO cost more CPU than it saved wall
    time (nanobind_runtime.py).
    """
    return (spec.kind == "module" and len(spec.sources) == 1 and not spec.debug
            and target.binding != NANOBIND and cxx.family == "gcc" and _lto_enabled()
            and not launcher_requested())


def _cuda(spec: BuildSpec, opt: Tuple[str, ...], target: _Target, system: Tuple[str, ...],
          includes: Tuple[str, ...]) -> Tuple[Optional[Compiler], Tuple[str, ...], Tuple[str, ...], Tuple[str, ...]]:
    """(nvcc, its flags, link flags, key parts) of a GPU build; (None, (), (), ()) for the CPU."""
    if spec.backend != "GPU":
        return None, (), (), ()
    from .tools.toolchain import cuda_lib_dir
    nvcc = find_nvcc(spec.root)
    identity = [f"nvcc={nvcc.identity}"]
    arch: List[str] = []
    ccbin: Tuple[str, ...] = ()
    if any(s.suffix in CUDA_SUFFIXES for s in spec.sources):
        from .tools.cuda_arch import arch_flags
        from .tools.toolchain import nvcc_host
        arch = arch_flags(spec.cuda_cflags, spec.root)[0]  # in cuda_flags, so in the key
        ccbin, host = nvcc_host(nvcc, spec.cuda_cflags, spec.root)  # CUDAHOSTCXX, or g++ on PATH
        identity.append(f"nvcc_host={host}")
    flags = ("-std=c++17", *ccbin, "-Xcompiler", "-fPIC", *opt, *target.defines, *system, *includes,
             *(("-Xcompiler", "-fvisibility=hidden") if target.visibility else ()), *arch, *spec.cuda_cflags)
    lib = cuda_lib_dir(nvcc, spec.root)
    link = ((f"-L{lib}", f"-Wl,-rpath,{lib}") if lib else ()) + ("-lcudart",)
    return nvcc, flags, link, tuple(identity)


def _path_maps(project: Path, places: Dict[str, str], cxx: Compiler) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """(the C++ compiler's, nvcc's) flags that write the project as "." in the binary, and the
    toolchain's include directories by what they are.

    Not in the key: pybind11's and Python's headers assert(), so __FILE__ would name the virtual
    environment; these come after the project's, so they win for a virtual environment inside the
    project. Under sccache in a form it does not hash, so checkouts at other paths share its compiles
    (docs/reference/fleet.md); nvcc gets the plain form (it splits -Xcompiler at commas)."""
    maps = [(project, ".")] + [(Path(d), n.strip("<>").replace(" ", "-")) for d, n in places.items()]
    cxx_maps = tuple(f for d, n in maps for f in prefix_map_flags(d, cxx.family, launcher_is_sccache(), n))
    cuda_maps = tuple(x for d, n in maps for m in prefix_map_flags(d, cxx.family, False, n) for x in ("-Xcompiler", m))
    return cxx_maps, cuda_maps


def _plan(spec: BuildSpec, cxx: Compiler) -> _Plan:
    """The plan of ``spec`` built with ``cxx``: the flags of each step and the key's identity."""
    opt, speedups = _optimization(spec, cxx)
    hdr = headers_digest(spec.root)
    project = project_root(spec.sources)
    native = ((f"native_cpu={native_cpu()}",)  # -march=native: this CPU's code, not another's
              if wants_native_cpu((*spec.cflags, *spec.cuda_cflags)) else ())
    target = _target(spec, hdr, cxx)
    system = ("-isystem", str(include_dir()), *target.system)
    places = {str(include_dir()): "<opbuilder include>", **dict(target.places)}
    # deps=2: builds record the headers of user -isystem directories and the files whose creation would
    # change them (search_path.py); builds recorded without are not trusted to be current
    # the environment the compiler reads (CPLUS_INCLUDE_PATH ...: toolchain.COMPILER_ENV), when set
    env = _key_env(compiler_env(), project)
    identity = [f"kind={spec.kind}", f"backend={spec.backend}", f"name={spec.name}",
                *([f"headers={hdr}"] if target.reads_headers else []), f"cxx={cxx.identity}", "deps=2",
                *native, *target.identity, *env]
    lto = ("-flto",) if _use_lto(spec, target, cxx) else ()
    # the module name reaches C++ sources through a generated header (see pch.py), so that
    # these flags are the same for every operator and a precompiled header can be shared
    # -Werror=return-type: falling off the end of a function that returns a value is undefined behaviour
    # that gcc only warns about (a missing `return` built "fine" and crashed with a double free)
    flags = ("-std=c++17", "-fPIC", *opt, "-Werror=return-type", *speedups, *lto, *target.visibility,
             *target.binding_defines, *system, *spec.cflags)
    # -flto changes nothing gcc keeps in a PCH (it checks it): one PCH serves one- and several-source modules
    pch_flags = tuple(f for f in flags if f != "-flto")
    pch_parts = (("pch", f"cxx={cxx.identity}", f"headers={hdr}", *target.pch_identity, *native, *env, *pch_flags)
                 if target.pch_identity else ())
    includes = tuple(f"-I{p}" for p in spec.include_paths)
    nvcc, cuda_flags, cuda_link, cuda_identity = _cuda(spec, opt, target, system, includes)
    link = (*target.link, *spec.ldflags, *cuda_link)
    # -flto is not in the key: here it is a way to build one source (code generation in parallel at link
    # time), like the job count, not another program; with and without it (OPBUILDER_LTO, a launcher)
    # the same sources share one cache entry and one store entry
    identity += [*cuda_identity, "cxx_flags", *_key_flags((*pch_flags, *includes), places, project),
                 "cuda_flags", *_key_flags(cuda_flags, places, project), "link", *_key_flags(link, {}, project)]
    return _Plan(sources=spec.sources, objects=tuple(_object_name(s) for s in spec.sources),
                 rules=tuple("cuda" if s.suffix in CUDA_SUFFIXES else "cxx" for s in spec.sources),
                 output=target.output, cxx=cxx, flags=flags, includes=includes, nvcc=nvcc, cuda_flags=cuda_flags,
                 link_flags=link, identity=tuple(identity), pch_parts=pch_parts, pch_flags=pch_flags,
                 project=project, places=tuple(places.items()), toolchain_dirs=tuple(places),
                 binding=target.binding)


def _lookup(spec: BuildSpec, plan: _Plan, base: str, op_dir: Optional[Path] = None,
            store_owner: Optional[int] = None) -> Optional[Tuple[str, Path]]:
    """The published library for the current contents, if there is one and it is intact (published.py),
    in the cache or (``op_dir``, ``store_owner``) a prebuilt store. Every directory on the way is checked
    (trust.py): a link or an entry of another user (than the store's owner) is refused."""
    op_dir = spec.op_dir if op_dir is None else op_dir
    try:
        check_dir(op_dir, store_owner)
        check_dir(op_dir / "deps", store_owner)
    except FileNotFoundError:
        return None
    layouts = fp.read_manifest(op_dir, base, store_owner)
    for headers in layouts or ():
        digests = fp.current_digests(headers, plan.project)
        if digests is None:
            continue
        key = fp.full_key(base, digests)
        key_dir = op_dir / key
        if not verified_library(key_dir, plan.output, store_owner):
            continue
        warm_notes.note_lookup(key, [(resolve(h, plan.project), d == fp.ABSENT) for h, d in digests.items()])
        return key, key_dir / plan.output
    return None


def _prebuilt(spec: BuildSpec, plan: _Plan, base: str) -> Optional[Tuple[str, Path]]:
    """The build for the current contents from the first store in OPBUILDER_PREBUILT_DIR that has it intact."""
    for store in prebuilt_stores():
        hit = _lookup(spec, plan, base, store[0] / spec.op_dir.name, store[1])
        if hit is not None:
            return hit
    return None


def _prebuilt_for_stored_compilers(spec: BuildSpec) -> Optional[Tuple[str, Path]]:
    """On a node without a C++ compiler: the build for the current contents in a prebuilt store (or
    imported into the cache from a bundle), looked up with each compiler identity the stores' toolchain
    facts record (the machine that filled them had it) and each that came with a bundle's builds.
    Nothing can be compiled here, so only what was built elsewhere can serve the operator."""
    from .tools.toolchain import stored_compilers

    for cxx in stored_compilers(spec.root):
        try:
            plan = _plan(spec, cxx)
        except FileNotFoundError:  # nvcc missing as well (a GPU operator): its facts cannot be had here
            continue
        base = fp.base_key(plan.identity, fp.source_digests(spec.sources), plan.project)
        hit = _prebuilt(spec, plan, base) or _lookup(spec, plan, base)
        if hit is not None:
            return hit
    return None


def _compile_steps(spec: BuildSpec, plan: _Plan, build_dir: Path):
    """One Step per source, with the forced includes a module's C++ sources get; and the PCH, if any."""
    from .native import pch as pchmod
    from .compile.ninja_file import Step

    steps = []
    pch = None
    name_h = build_dir / "opbuilder_name.h"
    if spec.kind == "module":
        # and, in every C++ source, the GIL-release wrappers the module is linked with (gil_wrap.h)
        text = (f"// written by opbuilder: the module name for PYBIND11_MODULE(OB_EXTENSION_NAME, m)\n"
                f"#undef OB_EXTENSION_NAME\n#define OB_EXTENSION_NAME {spec.name}\n"
                f"#undef MS_EXTENSION_NAME\n#define MS_EXTENSION_NAME {spec.name}\n"
                + ('#include "opbuilder/detail/gil_wrap.h"\n' if _GIL_WRAP in plan.link_flags else ""))
        try:
            current: Optional[bytes] = read_file(name_h)
        except FileNotFoundError:
            current = None
        if current != text.encode():
            fp.write_text_atomic(name_h, text)
    use_pch = plan.binding is not None and plan.cxx.family == "gcc" and pchmod.enabled()
    for src, obj, rule in zip(plan.sources, plan.objects, plan.rules):
        extra: Tuple[str, ...] = ()
        if spec.kind == "module" and rule == "cxx":
            # relative to the build directory, where ninja runs the compiler: the same command in
            # every cache, so a compiler launcher's cache (sccache) hits across machines
            extra = ("-include", name_h.name)
            if use_pch and pchmod.eligible(src):
                if pch is None:  # opbuilder's installed one when it fits, else the cache's
                    pch = (pchmod.installed(installed_pch_key(plan), plan.cxx.identity)
                           or pchmod.prepare(spec.root, fp.digest_of(plan.pch_parts)))
                extra = ("-Winvalid-pch", "-include", os.path.relpath(pch.header, build_dir)) + extra
        steps.append(Step(src, obj, rule, extra))
    return steps, pch


def installed_pch_key(plan: _Plan) -> str:
    """The key of the precompiled header installed with opbuilder (native/pch.py) that serves ``plan``:
    its PCH's identity with the toolchain's include directories by what they are, not where (the wheel
    was built elsewhere), and this Python's full version (its headers are in the PCH)."""
    import sys
    return fp.digest_of(("installed-pch", f"python_version={sys.version.split()[0]}",
                         *_key_flags(plan.pch_parts, dict(plan.places), plan.project)))


def _search_paths(spec: BuildSpec, plan: _Plan, build_dir: Path):
    """Per compile rule, the include search path its depfiles are read with (search_path.py)."""
    from .compile.search_path import search_path

    from .tools.toolchain import env_include_flags, system_include_dirs

    untracked = (*plan.toolchain_dirs, *system_include_dirs(plan.cxx, spec.root))
    where = (str(build_dir), str(plan.project))
    env = env_include_flags(str(build_dir))  # CPATH ...: the user's directories, their headers tracked
    out = {"cxx": search_path((*plan.flags, *plan.includes, *env), (*spec.cflags, *plan.includes, *env), *where,
                              untracked)}
    if plan.nvcc is not None:  # the CUDA toolkit's headers are keyed by nvcc's identity (its release)
        toolkit = os.path.dirname(os.path.dirname(os.path.realpath(plan.nvcc.path)))
        cuda = (os.path.join(toolkit, "include"), os.path.join(toolkit, "targets"))
        out["cuda"] = search_path((*plan.cuda_flags, *env), (*spec.cuda_cflags, *plan.includes, *env), *where,
                                  untracked + cuda)
    return out


def _not_users(spec: BuildSpec, plan: _Plan) -> Tuple[str, ...]:
    """Directories whose headers are not the user's: opbuilder's, pybind11's, Python's, the compiler's
    own, the CUDA toolkit's, and the cache (the generated headers)."""
    from .tools.toolchain import system_include_dirs

    from .native.installed import NATIVE_DIR  # the installed precompiled header (native/pch.py)

    dirs = (*plan.toolchain_dirs, *system_include_dirs(plan.cxx, spec.root), str(spec.root), str(NATIVE_DIR))
    if plan.nvcc is not None:
        dirs += (os.path.dirname(os.path.dirname(os.path.realpath(plan.nvcc.path))),)
    return dirs


def _report_warnings(spec: BuildSpec, plan: _Plan, build_dir: Path) -> None:
    """Say on stderr how many warnings the compile gave about the user's own files (verbose: which)."""
    from .compile.compiler_warnings import report, user_warnings

    try:
        text = read_file(build_dir / "build.log").decode(errors="replace")
    except FileNotFoundError:
        return
    report(spec.name, user_warnings(text, str(build_dir), _not_users(spec, plan)), spec.verbose)


def _compile(spec: BuildSpec, plan: _Plan, base: str, sources: Dict[str, str]) -> Optional[Tuple[str, Path]]:
    """Build the sources whose digests ``base`` was computed from and publish them under it;
    None if an input changed after that, or the PCH was removed while it compiled (then nothing
    is recorded or published, and the caller builds again)."""
    import logging

    from .native import pch as pchmod
    from .cache import publish
    from .compile.ninja_file import write_build_file
    from .tools.launcher import compiler_launcher
    from .compile.ninja_run import run_ninja, stop_leftovers
    from .tools.toolchain import default_jobs, ninja_path
    from .cache.trust import check_tree, make_dir, make_dirs

    log = logging.getLogger("opbuilder")
    if spec.kind in ("module", "library"):
        _check_no_header_copy(spec)
    if "-flto" in plan.flags and not links_with_lto(plan.cxx, spec.root):  # -flto is not in the key
        log.info("%s: %s cannot link -flto objects; building without LTO", spec.name, plan.cxx.path)
        plan = plan._replace(flags=tuple(f for f in plan.flags if f != "-flto"))
    build_dir = spec.op_dir / "build"
    make_dirs(spec.op_dir, build_dir / "obj")
    stop_leftovers(build_dir)  # a killed build may have left compilers writing here
    check_tree(build_dir)  # everything ninja and the compiler will read, link or overwrite
    # what the objects were compiled with: the key's identity, plus -flto, which the key leaves out
    # (an -flto object holds no code, so one built the other way is stale)
    identity = fp.digest_of(plan.identity + tuple(f for f in plan.flags if f == "-flto"))
    steps, pch = _compile_steps(spec, plan, build_dir)
    todo = publish.stale_steps(build_dir, steps, identity, sources)
    (build_dir / plan.output).unlink(missing_ok=True)  # always relink from the objects now recorded
    jobs = default_jobs()
    # LTO's parallel code generation: the job count is not part of the key (same code either way)
    link_flags = plan.link_flags + ((f"-flto={jobs}",) if "-flto" in plan.flags else ())
    # with debug information, the build directory (the compiler's working directory) is written as "." too
    # (only then: the map names the cache, and a command that does not is the same on every machine)
    build_map = prefix_map_flags(build_dir, plan.cxx.family) if spec.debug else ()
    path_maps, cuda_path_maps = _path_maps(plan.project, dict(plan.places), plan.cxx)  # not on the warm path
    maps = path_maps + build_map
    cuda_maps = cuda_path_maps + tuple(x for m in build_map for x in ("-Xcompiler", m))
    write_build_file(build_dir / "build.ninja", todo, plan.objects, plan.output, plan.cxx.argv,
                     (*plan.flags, *plan.includes, *maps), plan.nvcc.argv if plan.nvcc else (),
                     (*plan.cuda_flags, *cuda_maps), link_flags, launcher=compiler_launcher())
    log.info("%s: compiling %d of %d source(s)", spec.name, len(todo), len(steps))
    from .compile.search_path import linked_archives
    archives = {p: d for p in linked_archives(plan.link_flags, str(build_dir))
                for d in [fp.file_state(Path(p))] if d is not None}
    try:
        from .compile.diagnostics import user_files
        started = run_ninja(ninja_path(), build_dir, jobs, spec.name, spec.verbose,
                            user_files(spec.sources, _not_users(spec, plan)))
    except BuildError:
        if pch is not None and not pch.header.is_file():  # `cache clean` removed it while we compiled
            log.warning("%s: the precompiled header was removed during the build; building again", spec.name)
            return None
        raise
    _check_outputs(spec, plan, build_dir, todo)
    changed = publish.record_objects(build_dir, todo, identity, started, spec.root, sources,
                                     _search_paths(spec, plan, build_dir))
    if changed:
        log.warning("%s: %s changed while it was being compiled; building again", spec.name, changed[0])
        return None
    relinked = [p for p, d in archives.items() if fp.file_state(Path(p)) != d]
    if relinked:  # what was linked is not known: the archive changed during the link
        log.warning("%s: %s changed while it was being linked; building again", spec.name, relinked[0])
        return None
    inputs = publish.recorded_inputs(build_dir, plan.objects, spec.sources)
    if spec.kind in ("module", "library"):
        _check_no_copy_read(spec, inputs)
    # static archives are copied into the library: keyed by their contents, like headers
    headers = {portable(p, plan.project): d for p, d in {**inputs, **archives}.items()}
    key = fp.full_key(base, headers)
    key_dir = make_dir(spec.op_dir / key)
    record = publish.publish_library(build_dir / plan.output, key_dir, plan.output)
    make_dir(spec.op_dir / "deps")
    manifest = fp.manifest_path(spec.op_dir, base)
    fp.write_json_atomic(manifest, fp.manifest_with([list(headers)], fp.kept_layouts(manifest)), durable=True)
    publish.write_build_info(key_dir, spec, base, record, plan.cxx, _binding_label(spec, plan.binding), headers)
    lib = key_dir / plan.output
    publish.prune_old_builds(spec.op_dir, keep=publish.KEEP_BUILDS, current=key)
    _report_warnings(spec, plan, build_dir)
    if pch is not None:
        pchmod.prune(spec.root, current=pch.dir.name)
        # started only now, and after the other libraries its load() builds (pch.after_builds): run
        # next to a compile, it slowed that compile by ~0.6 s of ~10.5
        if not pch.built and jobs > 1:
            pchmod.start_when_idle(pch, plan.cxx.argv, plan.pch_flags)
    return key, lib


def _check_no_header_copy(spec: BuildSpec) -> None:
    """A BuildError when a directory searched before opbuilder's own include directory holds another
    copy of opbuilder's headers (a vendored or older ``include/``): the sources would compile against
    the copy and call the core library built from the installed headers (crashes), or, through the
    precompiled header, silently get the installed ones instead."""
    from .compile.search_path import quoted_and_bracket_dirs
    from .tools.toolchain import env_include_flags

    dirs = [(str(s.parent), f"the directory of {s.name}") for s in spec.sources]
    dirs += [(str(p), "include_paths") for p in spec.include_paths]
    dirs += [(d, f"{flag} in cflags") for flag, d in quoted_and_bracket_dirs(spec.cflags)]
    dirs += [(d, "CPATH") for flag, d in quoted_and_bracket_dirs(env_include_flags(os.getcwd()))]
    found = shadowing_copy(dirs)
    if found is None:
        return
    d, how, header = found
    raise BuildError(f"building operator '{spec.name}' failed: {d} ({how}) holds another copy of opbuilder's headers, "
                     f"searched before the installed ones, and its {header} differs from "
                     f"{include_dir() / header}; the operator would compile against the copy but run on the "
                     f"installed opbuilder's core library and runtime (or, with the precompiled header, silently "
                     f"use the installed headers): remove {d} from the include path (opbuilder puts its own "
                     f"headers on it), or install the opbuilder version that copy belongs to", name=spec.name)


def _check_no_copy_read(spec: BuildSpec, inputs: Dict[str, str]) -> None:
    """A BuildError, before anything is published, when the compile read a copy of one of opbuilder's
    headers that differs from the installed one (headers.copy_read): what the include-path check before
    the compile cannot see (an ``-include`` of a copy, ``#include "../vendor/opbuilder/..."``)."""
    found = copy_read(inputs)
    if found is None:
        return
    path, header = found
    raise BuildError(f"building operator '{spec.name}' failed: it compiled against {path}, a copy of opbuilder's "
                     f"{header} that differs from the installed {include_dir() / header}; the operator would run "
                     f"on the installed opbuilder's core library and runtime, built from the installed headers: "
                     f"include opbuilder's headers as \"opbuilder/...\" from the installed opbuilder only (no path "
                     f"to a copy in #include or -include)", name=spec.name)


def _check_outputs(spec: BuildSpec, plan: _Plan, build_dir: Path, steps) -> None:
    """A BuildError naming the compiler if a compile that succeeded left no object or depfile: the
    command is not a compiler (``CXX=/bin/true``), and reading the missing files would fail obscurely."""
    for s in steps:
        for out in (s.obj, s.obj + ".d"):
            if not (build_dir / out).is_file():
                cuda = s.rule == "cuda" and plan.nvcc is not None
                var, tool = ("NVCC", plan.nvcc) if cuda else ("CXX", plan.cxx)
                env = os.environ.get(var)
                who = f"{var}={env!r} ({tool.path})" if env else f"the compiler {tool.path}"
                raise BuildError(f"building operator '{spec.name}' failed: {who} exited successfully compiling "
                                 f"{s.source.name} but wrote no {out}: it does not work as a C++ compiler "
                                 f"(-c, -o, -MD -MF as g++ and clang++ take them); set {var} to one", name=spec.name)


def _trusted(spec: BuildSpec) -> BuildSpec:
    """``spec`` with its cache root checked, created if missing, and resolved (trust.trusted_root)."""
    root = trusted_root(spec.root)
    return spec if root == spec.root else spec._replace(root=root)


def _os_error(spec: BuildSpec, err: OSError) -> BaseException:
    """What to raise for an OSError out of the builder: a BuildError saying what to do when it is a
    cache that cannot be written (read-only, full, an unwritable HOME), else the error itself."""
    if isinstance(err, UnsafeCacheDirError) or err.errno is None:
        return err
    return cache_os_error(spec.name, err, spec.root) or err


def _root_error(spec: BuildSpec, err: OSError) -> BaseException:
    return root_error(spec.name, spec.root, err)


def root_error(name: str, root: Path, err: OSError) -> BaseException:
    """What to raise when the cache root cannot be created or used: an unsafe one as it is; else a
    BuildError naming where the root came from (``OPBUILDER_CACHE_DIR='/proc/self/x'``) and why."""
    if isinstance(err, UnsafeCacheDirError) or err.errno is None:
        return err
    known = cache_os_error(name, err, root)
    why = str(known) if known is not None else (
        f"building operator '{name}' failed: cannot create the opbuilder cache directory {root} "
        f"({err.strerror}: {err.filename}); set OPBUILDER_CACHE_DIR to a directory you can create and write to")
    error = BuildError(f"{why} (the cache directory is {root_origin(root)})", name=name)
    error.cache_problem = True  # (cache_os_error)
    return error


def _build(spec: BuildSpec) -> Tuple[str, Path]:
    """(full key, library path), building if the current contents were never built (or the library
    published for them is damaged: then the new one replaces it). ``spec`` is ``_trusted``. One pass:
    ``Retry`` when an input changed while it compiled (retry.py)."""
    try:
        cxx = find_compiler(spec.root)
    except FileNotFoundError as e:
        hit = _prebuilt_for_stored_compilers(spec)
        if hit is not None:
            return hit
        if prebuilt_stores():
            raise ToolchainError(f"{e}; and no prebuilt store (OPBUILDER_PREBUILT_DIR) has a build of "
                                 f"'{spec.name}' for these sources", name=spec.name) from None
        if isinstance(e, ToolchainError):
            e.name = spec.name
        refuse_build(spec, e)  # OPBUILDER_NO_BUILD=1: a NoBuildError saying why nothing shipped fits
        raise
    plan = _plan(spec, cxx)
    base = fp.base_key(plan.identity, fp.source_digests(spec.sources), plan.project)
    hit = _prebuilt(spec, plan, base) or _lookup(spec, plan, base)
    if hit is not None:
        return hit
    refuse_build(spec)
    from .cache.lock import build_lock, lock_timeout
    from .cache.trust import make_dir

    lock_timeout()  # a bad OPBUILDER_LOCK_TIMEOUT is a ValueError now, not only when another build holds the lock
    make_dir(spec.op_dir)
    with build_lock(spec.op_dir, spec.name):
        sources = fp.source_digests(spec.sources)  # contents now, under the lock
        base = fp.base_key(plan.identity, sources, plan.project)
        hit = _lookup(spec, plan, base)  # another process may have built it meanwhile
        if hit is None:
            hit = _compile(spec, plan, base, sources)
    if hit is None:
        raise Retry(Reason.INPUT_CHANGED)
    return hit


def _build_checked(spec: BuildSpec, trusted: bool = False) -> Built:
    """One pass of ``_build`` on the trusted spec, with a cache that cannot be written explained
    (BuildError); ``Retry`` if the library is already gone (another process may prune it, the oldest
    builds or ``cache clean``, between our lookup and its use). ``trusted``: ``spec`` is ``_trusted``
    already (its root is checked once per load)."""
    try:
        spec = spec if trusted else _trusted(spec)
    except OSError as e:
        raise _root_error(spec, e) from e
    try:
        key, lib = _build(spec)
        if not lib.is_file():
            raise Retry(Reason.PRUNED)
    except OSError as e:
        raise _os_error(spec, e) from e
    return Built(spec, key, lib)


def _distrust(spec: BuildSpec, lib: Path, stamp: List[int], err: BaseException) -> None:
    """A library that passed its checks but that the loader rejects: forget it (under the lock, if it
    is still the same file), so the next build replaces it."""
    import logging

    from .cache.lock import build_lock
    from .cache.published import distrust

    logging.getLogger("opbuilder").warning("opbuilder: %s cannot be loaded (%s); building it again", lib, err)
    with build_lock(spec.op_dir, spec.name):
        distrust(lib.parent, lib.name, stamp)


def build_module(spec: BuildSpec) -> str:
    """``CustomOpBuilder.build()``: build module ``spec`` if needed (with nanobind's shared runtime, for
    a nanobind operator); the path of its shared library."""
    return str(retrying(spec.name, lambda: _build_with_runtime(spec)).built.library)


def load_module(spec: BuildSpec) -> ModuleType:
    """``CustomOpBuilder.load()`` when no shipped binary serves ``spec`` (cache/shipped.py) and its warm
    record does not fit (warm.py): the module for the sources as they are now, built if needed (the
    same object if unchanged); a warm record is written for the next load()."""
    with warm_notes.collecting():
        return retrying(spec.name, lambda: _load_once(spec))


def _load_once(spec: BuildSpec) -> ModuleType:
    """One pass of ``load_module``: build if needed and import; ``Retry`` when the library went missing
    before its import, or the loader rejected it (then it is forgotten, to be built again)."""
    asked = spec
    preload_libs, built = _build_with_runtime(spec)
    spec, key, lib = built
    memo = (str(spec.op_dir), key)
    with _loaded_lock:
        mod = _loaded.get(memo)
        if mod is not None:
            _remember_warm(asked, built, preload_libs)
            return mod
        # The first build imported in this process is module `name`; a later one (after an
        # edit) gets a name of its own, or pybind11 would return the module it made first.
        module_name = module_name_for(spec.name, key)
        try:
            stamp = stamp_of(os.lstat(lib))
            if preload_libs:
                try:
                    preload(preload_libs)
                except OSError as e:  # the runtime or core library pruned (cache clean) since the lookup
                    if all(os.path.exists(p) for p in preload_libs):
                        raise
                    raise Retry(Reason.PRUNED, e) from e
            mod = import_extension(spec.name, lib, module_name)
        except FileNotFoundError as e:
            raise Retry(Reason.PRUNED, e) from e  # pruned by another process between lookup and import
        except BuildError as e:
            if not lib.exists():
                raise Retry(Reason.PRUNED, e) from e
            if not (loader_error(e.__cause__) and built.in_cache):
                raise  # the operator's own fault, or a prebuilt store's library (never ours to forget)
            damaged = e
        else:
            _names_used.add(spec.name)
            _loaded[memo] = mod
            _remember_warm(asked, built, preload_libs)
            return mod
    _distrust(spec, lib, stamp, damaged.__cause__)  # outside _loaded_lock: it may wait for the build lock
    raise Retry(Reason.REJECTED, damaged)


def _remember_warm(asked: BuildSpec, built: Built, preload_libs: List[Path]) -> None:
    """The warm record of ``asked`` (warm.py) for its build ``built``, loaded after ``preload_libs``
    (with nanobind's runtime, which a process that has one leaves out of them)."""
    libs = list(preload_libs)
    if built.spec.binding == NANOBIND and loaded_runtime() is not None and loaded_runtime() not in libs:
        libs.insert(0, loaded_runtime())
    remember_warm(asked, built.spec, built.key, built.library, libs)


def _binding(spec: BuildSpec, recorded: bool = False) -> str:
    """The binding library of a module: as asked (``binding=``), else read from its sources; with
    ``recorded`` (``spec`` is ``_trusted``), remembered across processes in its cache directory."""
    if spec.binding:
        return spec.binding
    return detect_binding(spec.name, spec.sources, spec.op_dir / RECORD if recorded else None)


def _binding_label(spec: BuildSpec, binding: Optional[str]) -> Optional[str]:
    """What build.json (and ``cache list``) says of a module's binding: a PYBIND11_MODULE source built
    with nanobind says so (binding.py)."""
    if binding == NANOBIND and from_pybind11(spec.sources):
        return "nanobind (a PYBIND11_MODULE source that binds plain functions only)"
    return binding


def _pybind11_fallback(spec: BuildSpec) -> Optional[BuildSpec]:
    """``spec`` on pybind11 when it is a PYBIND11_MODULE source set built with nanobind by choice
    (binding.py, not ``binding=``): if that build fails, the source still builds as it was written;
    else None."""
    if spec.kind != "module" or not from_pybind11(spec.sources):
        return None
    return spec._replace(binding=PYBIND11)


def _runtime_for(spec: BuildSpec) -> Optional[Path]:
    """nanobind's shared runtime (built if needed) when ``spec``'s sources are bound with nanobind;
    None for pybind11 sources (BuildError, binding.py, for sources that mix both or define no module)."""
    if spec.kind != "module" or _binding(spec) != NANOBIND:
        return None
    from .native import nanobind_runtime
    if nanobind_runtime.loaded() is not None:  # this process has one: later loads need no lookup
        return nanobind_runtime.loaded()
    return _dependency(nanobind_runtime.runtime_spec(spec.root, spec.verbose))


def _core_for(spec: BuildSpec) -> Optional[Path]:
    """The core library (built if needed) when ``spec`` is a nanobind operator that links to it
    (core_lib.py); None when it compiles the core itself."""
    if spec.kind != "module" or spec.backend != "CPU" or _binding(spec) != NANOBIND or not uses_core(spec):
        return None
    from .native.core_lib import core_spec
    return _dependency(core_spec(spec.root, spec.verbose))


def _dependency(dep: BuildSpec) -> Path:
    """A shared library operators load first (nanobind's runtime, the core library), built if needed,
    asked for on its own (``runtime_library()``, ``core_library()``): one ``retrying`` loop around its
    pass, as every entry point has (``load``, ``build``, ``build_library``; retry.py)."""
    return _installed(dep) or retrying(dep.name, lambda: _build_checked(dep)).library


def _cached(spec: BuildSpec) -> Optional[Path]:
    """The library already built for ``spec`` (the cache or a prebuilt store), without building or
    locking; None when it must be built (or cannot be looked up here: ``_build_checked`` says why)."""
    installed = _installed(spec)
    if installed is not None:
        return installed
    hit = _cached_build(spec)
    return None if hit is None else hit.library


def _installed(dep: BuildSpec) -> Optional[Path]:
    """opbuilder's installed build of nanobind's runtime or the core library (native/installed.py) when
    it serves operators built here (the same ABI, whatever the compiler); else None."""
    if dep.kind not in ("runtime", "core"):
        return None
    from .native.installed import enabled, library_for
    if not enabled():
        return None
    from .native.abi import cxx_abi
    try:
        return library_for(dep.kind, cxx_abi(find_compiler(dep.root), dep.root), dep.root)
    except (OSError, BuildError):
        return None


def _cached_build(spec: BuildSpec, trusted: bool = False, digests: Optional[Dict[str, str]] = None
                  ) -> Optional[Built]:
    """``_build_checked(spec)`` when it would build nothing; else None. ``trusted``: ``spec`` is
    ``_trusted`` already (its root is checked once per load); ``digests``: its sources' digests, if
    they were read already (with its binding)."""
    try:
        spec = spec if trusted else _trusted(spec)
        plan = _plan(spec, find_compiler(spec.root))
        base = fp.base_key(plan.identity, fp.source_digests(spec.sources) if digests is None else digests,
                           plan.project)
        hit = _prebuilt(spec, plan, base) or _lookup(spec, plan, base)
    except (OSError, BuildError):
        return None
    return None if hit is None else Built(spec, *hit)


def _dep_names(spec: BuildSpec) -> List[str]:
    """The names of the shared libraries nanobind module ``spec`` loads before it is imported:
    nanobind's runtime (unless this process has one already) and the core library, if it links to
    it (their cache directories are ``<name>.lib``)."""
    from .native.core_lib import CORE_NAME
    names = [] if loaded_runtime() is not None else [RUNTIME_NAME]
    return names + [CORE_NAME] if spec.backend == "CPU" and uses_core(spec) else names


def _dep_specs(spec: BuildSpec) -> List[BuildSpec]:
    """The builds of the shared libraries a module loads before it is imported (``_dep_names``)."""
    if spec.kind != "module" or _binding(spec) != NANOBIND:
        return []
    from .native.core_lib import CORE_NAME, core_spec
    from .native.nanobind_runtime import runtime_spec
    return [core_spec(spec.root, spec.verbose) if n == CORE_NAME else runtime_spec(spec.root, spec.verbose)
            for n in _dep_names(spec)]


def _build_with_runtime(spec: BuildSpec) -> ModuleBuild:
    """A module built (``_build_checked``) with the shared libraries it loads first. A warm module
    names them in its record (written by needs.py, read by importer.recorded): one stat each, no
    lookup. Otherwise each is looked up, and one not built yet is built in a thread beside the
    operator's own compile (``_beside_dependencies``). A PYBIND11_MODULE source that nanobind fails
    to build is built with pybind11 (``_pybind11_fallback``)."""
    if spec.kind != "module":
        return ModuleBuild([], _build_checked(spec))
    spec, detected, digests = _bound(spec)
    if spec.binding != NANOBIND:
        return ModuleBuild([], _built_module(spec, detected))
    warm = _cached_build(spec, trusted=True, digests=digests)
    recorded = None if warm is None else _recorded_preload(spec, warm)
    if recorded is not None:
        return ModuleBuild(recorded, warm)
    fallback = _pybind11_fallback(spec) if warm is None and detected else None
    if fallback is not None:
        cached = _cached_build(fallback)  # its nanobind build failed before: built with pybind11 then
        if cached is not None:
            return ModuleBuild([], cached)
    if warm is None:
        _check_no_header_copy(spec)  # before its runtime and core library start compiling
    done = _beside_dependencies(_dep_specs(spec), lambda: warm if warm is not None else
                                _built_or_fallback(spec, detected, fallback))
    if done.built.spec.binding != NANOBIND:  # fell back to pybind11: it loads nothing first
        return ModuleBuild([], done.built)
    if done.built.in_cache:
        from .needs import record
        record(done.built.library, done.preload)
    return done


def _built_or_fallback(spec: BuildSpec, detected: bool, fallback: Optional[BuildSpec]) -> Built:
    """``_built_module(spec)``; if nanobind fails to build a PYBIND11_MODULE source (``fallback``: the
    same sources on pybind11), the source built as it was written."""
    try:
        return _built_module(spec, detected)
    except BuildError:
        if fallback is None:
            raise
        import logging
        logging.getLogger("opbuilder").warning(
            "opbuilder: %s: building its PYBIND11_MODULE source with nanobind failed; building it with pybind11 "
            "(binding='pybind11' skips nanobind)", spec.name)
        return _built_module(fallback, detected)


def _bound(spec: BuildSpec) -> _Bound:
    """``spec`` trusted (first: its binding may be read from its record in the cache) and with its
    binding decided; each source is read and hashed once, for its binding and its digest."""
    try:
        spec = _trusted(spec)
    except OSError as e:
        raise _root_error(spec, e) from e
    if spec.binding is not None:
        return _Bound(spec, False, None)
    binding, digests = binding_and_digests(spec.name, spec.sources, spec.op_dir / RECORD)
    return _Bound(spec._replace(binding=binding), True, digests)


def _recorded_preload(spec: BuildSpec, warm: Built) -> Optional[List[Path]]:
    """What the warm build ``warm`` recorded it loads first, if the record is complete and its
    libraries are there; None to look them up (a prebuilt store's build has no record)."""
    if not warm.in_cache:
        return None
    return recorded_deps(warm.library, [f"{n}.lib" for n in _dep_names(spec)])


def _beside_dependencies(deps: List[BuildSpec], build_module: Callable[[], Built]) -> ModuleBuild:
    """``build_module()``, with each of ``deps`` not built yet built in a thread beside it: a newcomer
    waits for the longest of them, not their sum (the operator needs them only when it is imported).
    The operator's PCH precompile starts once every compile here is done. A dependency's error is
    raised after the module's own, unless the module fell back to pybind11 (it needs none of them)."""
    from .native.pch import after_builds

    libs: Dict[int, Path] = {}
    from .compile.build_limits import stop_event, stopping

    errors: List[BaseException] = []
    workers = []
    stop = stop_event()  # an interrupted load_many stops these too
    with after_builds():
        for i, dep in enumerate(deps):
            lib = _cached(dep)
            if lib is not None:
                libs[i] = lib
                continue

            def build_dep(i: int = i, dep: BuildSpec = dep) -> None:
                try:
                    with stopping(stop):
                        libs[i] = _build_checked(dep).library
                except BaseException as e:  # raised in the caller's thread below
                    errors.append(e)

            worker = threading.Thread(target=build_dep, name=f"opbuilder-{dep.name}", daemon=True)
            worker.start()
            workers.append(worker)
        try:
            built = build_module()
        finally:
            for worker in workers:
                worker.join()
    if built.spec.binding != NANOBIND:
        return ModuleBuild([], built)
    if errors:
        raise errors[0]
    from .native import nanobind_runtime
    found = [libs[i] for i in range(len(deps))]
    if nanobind_runtime.loaded() is not None and all(d.name != nanobind_runtime.RUNTIME_NAME for d in deps):
        found.insert(0, nanobind_runtime.loaded())
    return ModuleBuild(found, built)


def _built_module(spec: BuildSpec, detected: bool) -> Built:
    """``_build_checked(spec)`` for a module whose spec is ``_trusted``; then, if its binding was
    ``detected`` from the sources, recorded in its cache directory (it exists now), so that the next
    process reads it instead of scanning them."""
    built = _build_checked(spec, trusted=True)
    if detected:
        detect_binding(spec.name, spec.sources, built.spec.op_dir / RECORD)
    return built


def build_library(name: str, sources: Union[PathLike, Sequence[PathLike]], backend: str = "CPU",
                  include_paths: Optional[Sequence[PathLike]] = None, cflags: Optional[Sequence[str]] = None,
                  ldflags: Optional[Sequence[str]] = None, build_dir: Optional[PathLike] = None,
                  debug_mode: bool = False, verbose: bool = False,
                  cuda_cflags: Optional[Sequence[str]] = None) -> str:
    """Build a plain shared library (no pybind11, symbols exported), e.g. for aot ops; its path."""
    spec = make_spec(name, sources, backend, "library", include_paths, cflags, cuda_cflags, ldflags, debug_mode,
                     verbose_requested(verbose), cache_root(build_dir))
    check_layout_flags(spec)
    return str(retrying(name, lambda: _build_checked(spec)).library)
