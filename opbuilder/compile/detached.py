"""Python processes that outlive their caller: the PCH's precompile (native/pch.py) and to_torch's
bridge build that an operator's first torch tensor asks for (bridges/torch_bridge.py).

Each runs ``python -P -c CODE ARGS`` in a session of its own, its standard streams on /dev/null, so
it keeps running after the caller exits and never writes to the caller's terminal. ``-P`` keeps the
caller's current directory off ``sys.path``: a ``torch/`` or ``json.py`` there is never imported.
It is started through ``sh``, which exits at once: the process is then the init process's child, and
the caller has no zombie to reap and no ``Popen`` left running (a ResourceWarning under ``-X dev``).
"""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Mapping, Optional, Sequence

# sh starts the command in the background and prints its pid; the command's streams are /dev/null
_SPAWN = '"$@" </dev/null >/dev/null 2>&1 & echo $!'


def can_start() -> Optional[str]:
    """None if this process can start one, else why not: a frozen application (PyInstaller) or an
    embedded interpreter (uwsgi) has no Python executable to run, and would start itself again."""
    exe = sys.executable or ""
    if getattr(sys, "frozen", False) or not os.path.basename(exe).startswith(("python", "pypy")):
        return f"this process's executable ({exe or 'none'}) is not a Python interpreter"
    return None


def start(code: str, args: Sequence[str], env: Mapping[str, str]) -> int:
    """Start ``python -P -c code *args`` detached, with ``env`` and umask 077; returns its pid.
    Raises OSError (or CalledProcessError) if it cannot be started."""
    argv = [sys.executable, "-P", "-c", code, *args]
    done = subprocess.run(["/bin/sh", "-c", _SPAWN, "sh", *argv], env=dict(env), stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
                          close_fds=True, umask=0o077, check=True, timeout=60)
    return int(done.stdout.split()[0])
