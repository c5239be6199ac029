"""The build guard's eyes in child processes (tests/build_guard.py).

The guard puts this directory first on PYTHONPATH and names a log file in
OPBUILDER_BUILD_GUARD_SPAWNS. Every Python process of the test session then
imports this file at start-up. Its audit hook appends one line per compiler
or ninja the process starts, tagged with the test that was running when the
process started (OPBUILDER_BUILD_GUARD_PHASE). A child that builds its
grandchild's environment from scratch gets the variables put back, so
grandchildren are seen too. Without the variable this file does nothing but chain to the
sitecustomize it shadows.
"""
from __future__ import annotations

import os
import sys

ENV = "OPBUILDER_BUILD_GUARD_SPAWNS"
PHASE = "OPBUILDER_BUILD_GUARD_PHASE"  # the fixture or test that was running when the process started
HERE = os.path.dirname(os.path.abspath(__file__))
# executables that compile or drive a compile: compilers by any version suffix (g++-12), ninja, nvcc
COMPILERS = frozenset({"ninja", "nvcc", "cc", "c++", "g++", "gcc", "clang", "clang++"})


def is_compiler(name: str) -> bool:
    """Whether an executable's file name is a compiler's (no ``re``: every Python child imports this file)."""
    base, dash, version = name.partition("-")
    return base in COMPILERS and (not dash or (version != "" and all(c.isdigit() or c == "." for c in version)))


def _name(executable, argv) -> str:
    first = executable or (argv[0] if isinstance(argv, (list, tuple)) and argv else argv)
    if isinstance(first, (str, bytes, os.PathLike)):
        return os.path.basename(os.fsdecode(first))
    return ""


def _keep_watching(env) -> None:
    """Put the guard's variables back into an environment a test built for its child."""
    if not isinstance(env, dict) or ENV not in os.environ:
        return
    enc = os.fsencode if any(isinstance(k, bytes) for k in env) else str
    env[enc(ENV)] = enc(os.environ[ENV])
    env[enc(PHASE)] = enc(os.environ.get(PHASE, ""))
    path = os.fsdecode(env.get(enc("PYTHONPATH"), enc("")))
    if HERE not in path.split(os.pathsep):
        env[enc("PYTHONPATH")] = enc(os.pathsep.join(p for p in (HERE, path) if p))


def record(log: str):
    """An audit hook that appends ``<phase> <pid> <name>`` to ``log`` for each compiler a spawn starts.
    The phase is the test's or fixture's at the time this process started (the guard's own process:
    the current one), so a detached child that compiles later is not blamed on a later test."""
    def hook(event: str, args: tuple) -> None:
        if event == "subprocess.Popen":
            name, env = _name(args[0], args[1]), args[3]
        elif event in ("os.posix_spawn", "os.exec"):
            name, env = _name(args[0], args[1]), args[2]
        elif event == "os.system":
            cmd = os.fsdecode(args[0]).split()
            name, env = (os.path.basename(cmd[0]) if cmd else ""), None
        else:
            return
        _keep_watching(env)
        if is_compiler(name):
            try:  # one short O_APPEND write: lines from concurrent processes do not interleave
                fd = os.open(log, os.O_WRONLY | os.O_APPEND)
            except OSError:  # the session is over (the guard removed its log)
                return
            try:
                os.write(fd, f"{os.environ.get(PHASE) or '-'} {os.getpid()} {name}\n".encode())
            finally:
                os.close(fd)
    return hook


def _chain() -> None:
    """Run the sitecustomize this file hides, if the interpreter has one."""
    import importlib.machinery
    import importlib.util
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [p for p in sys.path if
                                                                     os.path.abspath(p or ".") != HERE])
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if __name__ == "sitecustomize":
    if os.environ.get(ENV):
        sys.addaudithook(record(os.environ[ENV]))
    _chain()
