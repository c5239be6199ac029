"""Helpers for the builder tests: tiny sources that compile in a fraction of a second,
and CXX wrapper scripts that log (and can stall) every compiler run."""
from __future__ import annotations

import os
import shutil
import stat
import sys
import textwrap
import time
from pathlib import Path
from typing import List, Optional

from opbuilder.tools.probe_cache import SETTLE_NS

REAL_CXX = shutil.which("c++") or shutil.which("g++")
PYTHON = sys.executable

# A Python extension module on the bare C API: a real module that load() imports,
# without pybind11, so each build costs well under a second.
TINY_MODULE = """\
#include <Python.h>
{includes}
#define OB_CAT2(a, b) a##b
#define OB_CAT(a, b) OB_CAT2(a, b)
{decls}
static PyObject *value(PyObject *, PyObject *) {{ return PyLong_FromLong({value}); }}
static PyMethodDef methods[] = {{{{"value", value, METH_NOARGS, nullptr}}, {{nullptr, nullptr, 0, nullptr}}}};
static PyModuleDef def = {{PyModuleDef_HEAD_INIT, "tiny", nullptr, -1, methods}};
PyMODINIT_FUNC OB_CAT(PyInit_, OB_EXTENSION_NAME)(void) {{ return PyModule_Create(&def); }}
"""


def tiny_module(path: Path, value: str = "1", includes: str = "", decls: str = "") -> Path:
    """Write a bare-C-API module whose ``value()`` returns the C++ expression ``value``."""
    path.write_text(TINY_MODULE.format(value=value, includes=includes, decls=decls))
    return path


# a server as a compiler wrapper may start one: it moves to / or to a session of its own, then says its pid
_DAEMON = ("import os, sys, time; os.setsid() if sys.argv[2] == \"session\" else os.chdir(\"/\"); "
           "open(sys.argv[1] + \".tmp\", \"w\").write(str(os.getpid())); "
           "os.rename(sys.argv[1] + \".tmp\", sys.argv[1]); time.sleep(300)")


def wrapper_cxx(directory: Path, log: Path, stall_flag: Optional[Path] = None, daemons: bool = False) -> str:
    """A CXX that appends each command line to ``log`` and runs the real compiler.

    While ``stall_flag`` exists, a compile (``-c``) instead writes garbage to its
    output, records its pid in ``<flag>.pid``, creates ``<flag>.started`` and
    sleeps; if it ever wakes up it writes garbage again: a build killed
    mid-compile, with a compiler left running. With ``daemons``, it first
    starts two servers, as a caching compiler wrapper may, and waits for their
    pids in ``<flag>.daemon-cwd`` (one working in /) and
    ``<flag>.daemon-session`` (one in a session of its own); both sleep 300 s.
    """
    stall = ""
    if stall_flag is not None:
        lines = []
        for kind in ("cwd", "session") if daemons else ():
            ready = f"{stall_flag}.daemon-{kind}"
            lines += [f"'{PYTHON}' -c '{_DAEMON}' '{ready}' {kind} &", f"while [ ! -e '{ready}' ]; do sleep 0.01; done"]
        start_daemons = "".join(" " * 16 + line + "\n" for line in lines)
        stall = textwrap.dedent(f"""\
            case " $* " in *" -c "*)
              if [ -e '{stall_flag}' ]; then
                out=; prev=
                for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done
                echo 'not an object file' > "$out"
{start_daemons}                echo $$ > '{stall_flag}.pid'
                touch '{stall_flag}.started'
                sleep 120
                echo 'written after the build was killed' > "$out"
                exit 0
              fi;;
            esac
            """)
    script = directory / "cxx-wrapper.sh"
    script.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$*\" >> '{log}'\n{stall}exec '{REAL_CXX}' \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    time.sleep(SETTLE_NS / 1e9 + 0.05)  # so its --version answer may be remembered (see probe_cache)
    return str(script)


def compiled_sources(log: Path) -> List[str]:
    """File names of the sources compiled (``-c``) according to a wrapper log, in order."""
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        args = line.split()
        if "-c" in args:
            out.append(Path(args[args.index("-c") + 1]).name)
    return out


def version_probes(log: Path) -> int:
    return sum(1 for line in log.read_text().splitlines() if line.strip() == "--version") if log.exists() else 0


def process_gone(pid: int) -> bool:
    """True if ``pid`` no longer runs (gone, or a zombie nobody reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return True


def child_env(**extra: str) -> dict:
    env = dict(os.environ)
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    return env



def build_cache(directory: Path, name: str, value: str) -> Path:
    """A cache in ``directory/cache`` holding one built tiny module ``name`` (its ``value()``
    returns ``value``), from the source ``directory/<name>.cpp``; the cache's path."""
    from opbuilder import CustomOpBuilder

    cache = directory / "cache"
    CustomOpBuilder(name, [tiny_module(directory / f"{name}.cpp", value)], build_dir=cache).build()
    return cache


def copy_cache(cache: Path, dst: Path) -> Path:
    """A copy of a built cache (links kept as links, modes kept): each test damages its own."""
    shutil.copytree(cache, dst, symlinks=True)
    return dst


def copied_session_cache(cache_dir: Path, cache: Path, keep=("_nanobind.lib", "_obcore.lib", "my_ops")) -> Path:
    """A copy at ``cache`` of the session's cache with only the builds named in ``keep`` (by default the
    runtime, the core library and my_ops), with the cache's own files: its files are new, so their stamps
    are not the recorded ones. Other tests' builds may be running in the session's cache (a file ninja
    holds for a moment, gone before it is copied, failed the copy), so nothing else is copied."""
    keep = set(keep)

    def ignore(directory: str, names: list) -> set:
        if Path(directory) == cache_dir:
            return {n for n in names if n not in keep and (n.startswith(".") or (cache_dir / n).is_dir())}
        return {n for n in names if n == ".pch" or n.endswith(".lock") or n == ".ninja_lock"}

    shutil.copytree(cache_dir, cache, symlinks=True, ignore=ignore)
    os.chmod(cache, 0o700)
    return cache


def key_dir(cache: Path, name: str) -> Path:
    """The one published build of operator ``name`` in ``cache``."""
    dirs = [d for d in (cache / name).iterdir() if d.name not in ("build", "deps") and not d.name.startswith(".")]
    assert len(dirs) == 1, dirs
    return dirs[0]


def run_python(code: str, *args: str, timeout: int = 300, **env: str):
    """Run ``code`` in a new Python process (a crash is its exit status, not ours)."""
    import subprocess
    return subprocess.run([PYTHON, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
                          env=child_env(**env))


def cuda_toolkit_problem() -> Optional[str]:
    """Why a GPU build cannot link here (None if it can): nvcc and, beside it, libcudart."""
    from opbuilder.tools.toolchain import cuda_lib_dir, find_nvcc
    try:
        nvcc = find_nvcc(None)
    except FileNotFoundError:
        return "nvcc (the CUDA toolkit) is not installed"
    lib = cuda_lib_dir(nvcc)
    if lib is None or not (Path(lib) / "libcudart.so").exists():
        return (f"libcudart.so is not where the builder looks for it beside {nvcc.path} ({lib}); "
                f"set CUDA_HOME to the CUDA toolkit")
    return None


def _runtime_file(name: str) -> str:
    """The compiler's copy of a runtime library, or "" if it has none."""
    import subprocess
    try:
        out = subprocess.run([os.environ.get("CXX", "c++"), f"-print-file-name={name}"], capture_output=True,
                             text=True).stdout.strip()
    except OSError:
        return ""
    return out if os.path.isabs(out) and os.path.exists(out) else ""


def require_asan() -> None:
    """Skip the calling test where the compiler has no AddressSanitizer runtime."""
    import pytest
    if not _runtime_file("libasan.so"):
        pytest.skip("the compiler's AddressSanitizer runtime (libasan.so) is not installed")


def run_sanitized_child(args: List[str], ok_marker: str, cwd: Optional[Path] = None) -> None:
    """Run ``python args...`` with ASan and UBSan preloaded (libstdc++ too: ASan must find __cxa_throw when
    it starts, and python does not link it); assert it printed ``ok_marker`` last and no sanitizer report."""
    import subprocess
    require_asan()
    env = dict(os.environ, LD_PRELOAD=f"{_runtime_file('libasan.so')} {_runtime_file('libstdc++.so.6')}",
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=1", UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    res = subprocess.run([PYTHON, *args], env=env, capture_output=True, text=True, timeout=600, cwd=cwd)
    assert res.returncode == 0 and res.stdout.strip().endswith(ok_marker), res.stdout + res.stderr[-8000:]
    assert "runtime error" not in res.stderr and "AddressSanitizer" not in res.stderr, res.stderr[-8000:]
