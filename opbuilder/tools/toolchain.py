"""Finding the tools a build uses, kept apart from building.

The compiler comes from ``CXX`` (default ``c++``); its identity (resolved
path and ``--version`` line) is probed once and remembered in the cache
directory (``probe_cache``), so the warm path runs no process. The same goes
for pybind11's version and include directory and Python's include
directory. ninja comes from the installed ``ninja`` package, not PATH.
Everything here that the warm path calls avoids slow imports (subprocess,
shutil, sysconfig, pybind11 itself): those happen only when a probe runs.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..errors import ToolchainError
from .probe_cache import remembered

__all__ = ["Compiler", "PythonInfo", "find_compiler", "find_nvcc", "python_info", "python_headers", "ninja_path",
           "ext_suffix",
           "default_jobs", "cuda_lib_dir", "which", "system_include_dirs", "native_cpu", "wants_native_cpu",
           "links_with_lto"]


class Compiler:
    """A resolved compiler: argv prefix, the binary it resolves to, and what it is.

    ``identity`` (path and version line) goes into every cache key;
    ``family`` ("gcc", "clang", "nvcc" or "unknown") decides what the builder
    may ask of it (a precompiled header only with gcc).
    """

    __slots__ = ("argv", "path", "identity", "family", "version")

    def __init__(self, argv: Tuple[str, ...], path: str, identity: str, family: str, version: str) -> None:
        self.argv, self.path, self.identity, self.family, self.version = argv, path, identity, family, version

    def __repr__(self) -> str:
        return f"Compiler({self.path!r}, {self.version!r}, family={self.family!r})"


class PythonInfo:
    """What a pybind11 module is compiled against: this Python and the installed pybind11."""

    __slots__ = ("pybind11_version", "pybind11_include", "python_include", "abi")

    def __init__(self, pybind11_version: str, pybind11_include: str, python_include: str, abi: str) -> None:
        self.pybind11_version, self.pybind11_include = pybind11_version, pybind11_include
        self.python_include, self.abi = python_include, abi


def which(cmd: str) -> Optional[str]:
    """``cmd`` if it is a path to an executable, else its first match on PATH (like ``shutil.which``,
    without importing shutil on the warm path)."""
    # os.access first: it answers False for a directory without ``cmd`` where isfile() raises and
    # catches an error (every PATH entry before the compiler's, in each warm load(): half its cost)
    if os.sep in cmd:
        return cmd if os.access(cmd, os.X_OK) and os.path.isfile(cmd) else None
    seen = set()
    for d in os.environ.get("PATH", os.defpath).split(os.pathsep):
        if d in seen:  # a directory listed twice cannot hold a match the first time did not
            continue
        seen.add(d)
        p = os.path.join(d or ".", cmd)
        if os.access(p, os.X_OK) and os.path.isfile(p):
            return p
    return None


def _split(cmd: str) -> Tuple[str, ...]:
    if not any(c in cmd for c in " \t\"'\\"):
        return (cmd,) if cmd else ()
    import shlex
    return tuple(shlex.split(cmd))


def _family(version_text: str) -> str:
    low = version_text.lower()
    if "clang" in low:
        return "clang"
    if "nvidia" in low or "cuda compilation tools" in low:
        return "nvcc"
    if "free software foundation" in low or "(gcc)" in low:
        return "gcc"
    return "unknown"


_COMPILER_FACTS = {"identity": str, "family": str, "version": str, "path": str}


# gcc, cc, clang (gcc-12, x86_64-linux-gnu-gcc-12, clang-17): the C drivers, named as given (clang++ links
# to clang, so the name is what tells them apart, not the file)
_C_DRIVER = r"^(?:.*-)?(?:gcc|cc|clang)(?:-\d+(?:\.\d+)*)?$"  # (re is imported by a probe only)


def _probe(argv: Tuple[str, ...], state_dir: Optional[Path], chosen_by: str = "") -> Compiler:
    """The compiler ``argv`` (its first item a found executable), probed at most once per binary.

    The record is looked up by ``argv`` and trusted while ``argv[0]``'s stamp
    matches. The stamp follows symlinks, so pointing a link (``c++``,
    ``update-alternatives``) at another binary changes it too; the warm path
    therefore resolves no links and runs no ``--version``. ``chosen_by`` says
    where ``argv`` came from (``CXX='/bin/false'``), for the error when it does
    not run or does not answer ``--version``.
    """
    exe = argv[0]
    origin = chosen_by or f"the compiler {exe}"

    def probe():
        import subprocess
        real = os.path.realpath(exe)
        try:
            out = subprocess.run(list(argv) + ["--version"], capture_output=True, text=True, timeout=60,
                                 stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError) as e:
            raise ToolchainError(f"{origin} cannot be run ({e}); set it to a working C++ compiler") from None
        text = (out.stdout or out.stderr).strip()
        if out.returncode != 0 or not text:
            first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
            said = f"; its first line: {first!r}" if first else ", printing nothing"
            raise ToolchainError(f"{origin} is not a working compiler: '{' '.join(argv)} --version' exited with "
                                 f"status {out.returncode}{said}. Set it to a C++ compiler (g++, clang++)")
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        version = next((ln for ln in lines if " release " in ln), lines[0])  # nvcc says it on a later line
        identity = " ".join(argv[1:] + (real,) + tuple(ln for ln in lines if "copyright" not in ln.lower()))
        return {"identity": identity, "family": _family(text), "version": version, "path": real}, [exe]

    facts = remembered(state_dir, f"compiler {' '.join(argv)}", probe, inputs=[exe], schema=_COMPILER_FACTS)
    return Compiler(argv, str(facts["path"]), str(facts["identity"]), str(facts["family"]), str(facts["version"]))


def links_with_lto(cxx: Compiler, state_dir: Optional[Path]) -> bool:
    """Whether ``cxx`` links an ``-flto`` shared library: probed once per compiler binary, remembered.

    A gcc installed without its LTO parts (no ``lto-wrapper``, a linker without the plugin) compiles
    ``-flto`` objects but cannot link them; LTO is only a faster way to build one source, so such a
    compiler builds without it. Asked only by a build that would use LTO, never on the warm path."""
    def probe():
        import subprocess
        import tempfile

        def run(args, **kw):
            return subprocess.run([*cxx.argv, *args], capture_output=True, text=True, timeout=120,
                                  stdin=kw.pop("stdin", subprocess.DEVNULL), **kw)
        with tempfile.TemporaryDirectory(prefix="opbuilder-lto-") as d:
            try:
                ok = run(["-flto", "-fPIC", "-shared", "-x", "c++", "-", "-o", os.path.join(d, "probe.so")],
                         stdin=None, input="int opbuilder_lto_probe() { return 0; }\n").returncode == 0
            except (OSError, subprocess.SubprocessError):
                ok = False
        # the answer depends on the parts the link runs too: installing or removing one asks again
        parts = [cxx.path]
        for flag, name in (("-print-prog-name=", "lto-wrapper"), ("-print-file-name=", "liblto_plugin.so"),
                           ("-print-prog-name=", "ld")):
            try:
                found = run([flag + name]).stdout.strip()
            except (OSError, subprocess.SubprocessError):
                continue
            if not os.path.isabs(found):  # gcc names a part it has no path for as it is: only ld is on PATH
                found = (which(found) or "") if name == "ld" else ""
            if found and os.path.exists(found):
                parts.append(os.path.realpath(found))
        return {"lto": ok}, parts

    return bool(remembered(state_dir, f"lto {cxx.identity}", probe, schema={"lto": bool})["lto"])


def _resolve(cmd: str, what: str) -> Tuple[str, ...]:
    argv = _split(cmd)
    if not argv:
        raise ToolchainError(f"{what} is set but empty; unset it or set it to a compiler")
    exe = which(argv[0])
    if exe is None:
        raise ToolchainError(f"{what} compiler '{argv[0]}' was not found on PATH; "
                             f"install g++ (or clang++) or set {what} to the compiler's path")
    return (exe,) + argv[1:]


def find_compiler(state_dir: Optional[Path]) -> Compiler:
    """The C++ compiler: ``$CXX``, else c++, g++ or clang++ from PATH."""
    env = os.environ.get("CXX")
    if env is None or env == "":
        for cand in ("c++", "g++", "clang++"):
            exe = which(cand)  # one PATH search per candidate (the warm path pays for it)
            if exe:
                return _probe((exe,), state_dir)
        raise ToolchainError("no C++ compiler found (tried c++, g++, clang++ on PATH); "
                             "install g++ (e.g. apt-get install g++) or set CXX")
    argv = _resolve(env, "CXX")
    _refuse_c_driver(argv, f"CXX={env!r}")
    return _probe(argv, state_dir, f"CXX={env!r}")


def _refuse_c_driver(argv: Tuple[str, ...], origin: str) -> None:
    """A ToolchainError when the C++ compiler ``argv`` is a C driver (gcc, cc, clang): it compiles .cpp as
    C++ but links without the C++ runtime, so what it builds cannot be imported. Checked on each lookup,
    not only when probed (a probe remembered before this check). Not for nvcc's host compiler, which
    compiles host code only."""
    import re
    c_driver = next((a for a in argv if re.match(_C_DRIVER, os.path.basename(a))), None)
    if c_driver is not None and not any(a.startswith("--driver-mode=g++") for a in argv):  # (clang told C++)
        cxx = os.path.basename(c_driver).replace("clang", "clang++").replace("gcc", "g++").replace("cc", "c++")
        raise ToolchainError(f"{origin} is a C compiler driver: it compiles C++ but links without the C++ "
                             f"runtime (libstdc++), so what it builds cannot be imported; set CXX to its C++ "
                             f"driver ({cxx})")


def stored_compilers(cache: Optional[Path] = None) -> List[Compiler]:
    """The C++ compilers the prebuilt stores' toolchain facts record (probe_cache.share), and those that
    came with a bundle's builds into them or into the ``cache``: what a node without a compiler can
    still look up builds with, since their identities are in the stored keys."""
    from .probe_cache import BUNDLED_COMPILER, stored_records

    prefix = "compiler "
    out, seen = [], set()
    records = [(tuple(lookup[len(prefix):].split(" ")), f) for lookup, f in stored_records(prefix, _COMPILER_FACTS)]
    # those that came with a bundle's builds (bundle.py): looked up here only, never instead of a probe
    records += [((str(f["path"]),), f) for _, f in stored_records(BUNDLED_COMPILER, _COMPILER_FACTS, cache)]
    for argv, f in records:
        if f["family"] != "nvcc" and (f["identity"], f["family"]) not in seen:
            seen.add((f["identity"], f["family"]))
            out.append(Compiler(argv, str(f["path"]), str(f["identity"]), str(f["family"]), str(f["version"])))
    return out


# Environment variables the compilers and the linker read that change what they build: include
# directories searched (as -I: CPATH; as -isystem: the others), where cc1plus, as and ld and the
# libraries come from, an rpath, and flags nvcc and clang add. Their values are in every build's key
# (compiler_env), and headers found through the include directories are tracked like a -I one's
# (env_include_flags). Not SOURCE_DATE_EPOCH: without it __DATE__ differs every build anyway.
INCLUDE_ENV = {"CPATH": "-I", "CPLUS_INCLUDE_PATH": "-isystem", "C_INCLUDE_PATH": "-isystem",
               "OBJC_INCLUDE_PATH": "-isystem", "OBJCPLUS_INCLUDE_PATH": "-isystem"}
COMPILER_ENV = (*INCLUDE_ENV, "GCC_EXEC_PREFIX", "COMPILER_PATH", "LIBRARY_PATH", "LD_RUN_PATH",
                "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN", "CCC_OVERRIDE_OPTIONS")


def compiler_env() -> Tuple[str, ...]:
    """``NAME=value`` for each of COMPILER_ENV that is set (to anything, empty included), in that order:
    part of every build's key, so switching CPLUS_INCLUDE_PATH to a directory with another header
    builds again instead of serving the build made with the first."""
    env = os.environ
    return tuple(f"{k}={env[k]}" for k in COMPILER_ENV if k in env)


def env_include_flags(cwd: str) -> Tuple[str, ...]:
    """The include directories of INCLUDE_ENV as the flags they act as (``-I dir``, ``-isystem dir``),
    relative ones from ``cwd`` (where the compiler runs; an empty entry is ``cwd`` itself)."""
    out: List[str] = []
    for var, flag in INCLUDE_ENV.items():
        for d in os.environ.get(var, "").split(os.pathsep) if os.environ.get(var) else ():
            out += [flag, os.path.join(cwd, d) if d else cwd]
    return tuple(out)


def system_include_dirs(cxx: Compiler, state_dir: Optional[Path]) -> Tuple[str, ...]:
    """The directories ``cxx`` searches for ``#include <...>`` on its own (libstdc++'s, libc's), from
    ``-E -v``; probed once per binary. Empty if the compiler does not say (then their headers are tracked).
    Probed without INCLUDE_ENV: directories those name are the user's (their headers are tracked)."""
    def probe():
        import subprocess
        env = {k: v for k, v in os.environ.items() if k not in INCLUDE_ENV}
        try:
            out = subprocess.run([*cxx.argv, "-E", "-x", "c++", "-v", os.devnull, "-o", os.devnull], env=env,
                                 capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
            lines = out.stderr.splitlines()
        except (OSError, subprocess.SubprocessError):
            lines = []
        dirs, inside = [], False
        for ln in lines:
            if ln.startswith("#include <...> search starts here"):
                inside = True
            elif ln.startswith("End of search list"):
                inside = False
            elif inside and ln.startswith(" "):
                dirs.append(os.path.normpath(ln.strip().split(" (framework directory)")[0]))
        return {"dirs": dirs}, [cxx.argv[0]]

    facts = remembered(state_dir, f"own include dirs {' '.join(cxx.argv)}", probe, inputs=[cxx.argv[0]],
                       schema={"dirs": list})
    return tuple(str(d) for d in facts["dirs"])  # type: ignore[union-attr]


def find_nvcc(state_dir: Optional[Path]) -> Compiler:
    """nvcc for the GPU backend: ``$NVCC``, ``$CUDA_HOME/bin/nvcc``, or PATH."""
    env = os.environ.get("NVCC")
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    cand = env or (os.path.join(cuda_home, "bin", "nvcc") if cuda_home else "nvcc")
    try:
        argv = _resolve(cand, "NVCC")
    except FileNotFoundError:
        raise ToolchainError("backend='GPU' needs nvcc: install the CUDA toolkit, or set CUDA_HOME "
                             "or NVCC") from None
    return _probe(argv, state_dir, f"NVCC={env!r}" if env else "")


_CCBIN = ("-ccbin", "--compiler-bindir")


def nvcc_host(nvcc: Compiler, cuda_cflags: Sequence[str], state_dir: Optional[Path]) -> Tuple[Tuple[str, ...], str]:
    """The host compiler nvcc compiles a ``.cu`` with: (flags for nvcc, what goes into the key).

    ``-ccbin`` in ``NVCC`` or an operator's ``cuda_cflags`` decides it (the flag is in the key); else
    ``$CUDAHOSTCXX`` (CMake's name), passed as ``-ccbin``; else nvcc's own choice, ``g++`` on PATH.
    Both of the last two are keyed by the compiler's identity (path and ``--version``), so moving
    to another host compiler rebuilds the ``.cu`` sources. Probed once per binary (probe_cache)."""
    words = (*nvcc.argv, *cuda_cflags)
    if any(w in _CCBIN or w.startswith(tuple(f"{c}=" for c in _CCBIN)) for w in words):
        return (), "ccbin in the flags"
    env = os.environ.get("CUDAHOSTCXX")
    if env:
        host = _probe(_resolve(env, "CUDAHOSTCXX"), state_dir, f"CUDAHOSTCXX={env!r}")
        return ("-ccbin", host.argv[0]), host.identity
    exe = which("g++")
    return (), (_probe((exe,), state_dir).identity if exe else "no g++ on PATH")


def cuda_lib_dir(nvcc: Compiler, state_dir: Optional[Path] = None) -> Optional[str]:
    """The CUDA toolkit's library directory (where libcudart is), found once per nvcc.

    ``$CUDA_HOME``/``$CUDA_PATH`` if set; else the toolkit nvcc itself reports
    (``TOP`` in its ``-dryrun`` output), which also works when nvcc on PATH
    is a wrapper script.
    """
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")

    def probe():
        roots = [home] if home else []
        if not home:
            import subprocess
            try:
                out = subprocess.run([*nvcc.argv, "-dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                                     capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
                roots += [os.path.normpath(ln.split("=", 1)[1].strip().strip('"'))
                          for ln in (out.stdout + out.stderr).splitlines() if ln.startswith("#$ TOP=")]
            except (OSError, subprocess.SubprocessError):
                pass
            roots.append(os.path.dirname(os.path.dirname(nvcc.path)))
        for root in roots:
            for sub in ("lib64", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib", "lib"):
                d = os.path.join(root, sub)
                if os.path.isfile(os.path.join(d, "libcudart.so")):
                    return {"lib": d}, [nvcc.path]
        return {"lib": None}, [nvcc.path]

    return remembered(state_dir, f"cuda lib {nvcc.path} home={home}", probe,  # type: ignore[return-value]
                      schema={"lib": (str, type(None))})["lib"]


CPUINFO = "/proc/cpuinfo"
# what gcc's and clang's -march=native read from CPUID, as Linux shows it (x86, then Arm, RISC-V); not the
# clock speed, stepping or microcode, which change no code
_CPU_FIELDS = ("vendor_id", "cpu family", "model", "model name", "flags", "cache size", "CPU implementer",
               "CPU architecture", "CPU variant", "CPU part", "Features", "isa", "uarch")
_NATIVE_FLAGS = ("-march=native", "-mtune=native", "-mcpu=native")
_native_cpu: List[str] = []


def wants_native_cpu(flags: Sequence[str]) -> bool:
    """Whether ``flags`` ask the compiler for the code of the CPU it runs on (``-march=native``, ...)."""
    return any(n in f for f in flags for n in _NATIVE_FLAGS)


def native_cpu() -> str:
    """This machine's CPU as ``-march=native`` sees it: its first processor's vendor, family, model,
    feature flags and cache size from /proc/cpuinfo (read once per process; "unknown" without it).
    In the key of builds with such a flag, so a cache or store shared by machines with other CPUs
    never serves one machine's native code to another (it may not run there: SIGILL)."""
    if not _native_cpu:
        fields = []
        try:
            with open(CPUINFO, "rb") as f:
                block = f.read(1 << 16).decode(errors="replace").split("\n\n", 1)[0]
            for line in block.splitlines():
                key, _, value = line.partition(":")
                if key.strip() in _CPU_FIELDS:
                    fields.append(f"{key.strip()}={' '.join(value.split())}")
        except OSError:
            pass
        _native_cpu.append("; ".join(fields) or "unknown")
    return _native_cpu[0]


def ext_suffix() -> str:
    """The file suffix of an extension module for this Python (``.cpython-311-x86_64-linux-gnu.so``)."""
    return importlib.machinery.EXTENSION_SUFFIXES[0]


_origins: Dict[str, Optional[str]] = {}


def _package_origin(name: str) -> Optional[str]:
    """The ``__init__.py`` of the package ``name`` this process would import, found once per
    process (a search of sys.path that imports nothing; warm loads ask for it several times)."""
    if name not in _origins:
        spec = importlib.util.find_spec(name)
        _origins[name] = None if spec is None else spec.origin
    return _origins[name]


def python_info(state_dir: Optional[Path]) -> PythonInfo:
    """pybind11's version and headers and Python's headers, probed once per interpreter and pybind11."""
    origin = _package_origin("pybind11")
    if origin is None:
        raise ToolchainError("the 'pybind11' Python package is missing: python -m pip install pybind11")
    pkg = os.path.dirname(origin)

    def probe():
        import sysconfig

        import pybind11
        include = pybind11.get_include()
        facts = {"pybind11_version": pybind11.__version__, "pybind11_include": include,
                 "python_include": sysconfig.get_paths()["include"]}
        return facts, [origin, os.path.join(pkg, "_version.py"),
                       os.path.join(include, "pybind11", "detail", "common.h")]

    facts = remembered(state_dir, f"python {sys.executable} {sys.version} pybind11 {origin}", probe,
                       schema={"pybind11_version": str, "pybind11_include": str, "python_include": str})
    return PythonInfo(str(facts["pybind11_version"]), str(facts["pybind11_include"]),
                      str(facts["python_include"]), python_abi())


def python_abi() -> str:
    """This interpreter's ABI as keys name it: its bytecode tag and extension suffix."""
    from ..importer import interpreter_abi
    return interpreter_abi()


def python_headers(state_dir: Optional[Path]) -> Tuple[str, str]:
    """(Python's include directory, ``python_abi()``): what a nanobind module needs of this Python,
    probed once per interpreter. Unlike ``python_info`` it looks nothing of pybind11 up (a search of
    sys.path and three stamps, ~0.1 ms of a warm load())."""
    def probe():
        import sysconfig
        include = sysconfig.get_paths()["include"]
        return {"python_include": include}, [os.path.join(include, "Python.h")]

    facts = remembered(state_dir, f"python headers {sys.executable} {sys.version}", probe,
                       schema={"python_include": str})
    return str(facts["python_include"]), python_abi()


def ninja_path() -> str:
    """The ninja binary of the installed ``ninja`` package (not whatever PATH has)."""
    try:
        import ninja  # type: ignore
    except ImportError:
        raise ToolchainError("the 'ninja' Python package is missing: python -m pip install ninja") from None
    name = "ninja.exe" if os.name == "nt" else "ninja"
    exe = Path(ninja.BIN_DIR) / name
    if not ninja.BIN_DIR or not exe.exists():
        # A venv made with --system-site-packages sees the package but not its scripts
        # directory, and the package then reports BIN_DIR == "": its RECORD still names the file.
        exe = _ninja_from_record(ninja.__file__, name) or exe
    if not exe.is_file():
        raise ToolchainError(f"the ninja package has no binary at {exe}; reinstall it "
                             f"(python -m pip install --force-reinstall ninja)")
    return str(exe)


def _ninja_from_record(module_file: Optional[str], name: str) -> Optional[Path]:
    """The ninja binary as the installed ``ninja`` distribution's file list names it, if that
    distribution is the one imported (``module_file``) and the binary exists."""
    from importlib import metadata
    try:
        files = metadata.distribution("ninja").files or []
    except metadata.PackageNotFoundError:
        return None
    init = [f for f in files if str(f).replace("\\", "/") == "ninja/__init__.py"]
    if not module_file or not init or Path(init[0].locate()).resolve() != Path(module_file).resolve():
        return None
    for f in files:
        if f.name == name and f.parent.name in ("bin", "Scripts"):
            path = Path(f.locate()).resolve()
            if path.is_file():
                return path
    return None


_GIB = 1 << 30


def default_jobs() -> int:
    """``MAX_JOBS`` if set, else the usable cores, bounded by free memory (about 1 GiB per compile)."""
    env = os.environ.get("MAX_JOBS")
    if env:
        try:
            jobs = int(env)
        except ValueError:
            jobs = 0
        if jobs < 1:
            raise ValueError(f"MAX_JOBS must be a positive integer, got {env!r}")
        return jobs
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    avail = available_memory()
    if avail is not None:
        cores = min(cores, max(1, avail // _GIB))
    return max(1, cores)


def available_memory() -> Optional[int]:
    """Bytes of memory available to new processes (Linux ``MemAvailable``), or None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


class NanobindInfo:
    """What a nanobind module and nanobind's shared runtime are compiled against."""

    __slots__ = ("version", "include", "source", "robin_map")

    def __init__(self, version: str, include: str, source: str, robin_map: str) -> None:
        self.version, self.include, self.source, self.robin_map = version, include, source, robin_map


def nanobind_info(state_dir: Optional[Path]) -> NanobindInfo:
    """The installed nanobind's version, headers and runtime source, probed once per nanobind."""
    origin = _package_origin("nanobind")
    if origin is None:
        raise FileNotFoundError("the 'nanobind' Python package is missing (operators written with OB_MODULE "
                                "are bound with it): python -m pip install nanobind")
    pkg = os.path.dirname(origin)

    def probe():
        import nanobind
        facts = {"version": nanobind.__version__, "include": nanobind.include_dir(),
                 "source": nanobind.source_dir(), "robin_map": os.path.join(pkg, "ext", "robin_map", "include")}
        return facts, [origin, os.path.join(facts["include"], "nanobind", "nanobind.h")]

    facts = remembered(state_dir, f"nanobind {origin}", probe,
                       schema={"version": str, "include": str, "source": str, "robin_map": str})
    return NanobindInfo(str(facts["version"]), str(facts["include"]), str(facts["source"]), str(facts["robin_map"]))
