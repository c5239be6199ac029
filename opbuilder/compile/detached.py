"""Python processes that outlive their caller: the PCH's precompile (native/pch.py) and to_torch's
bridge build that an operator's first torch tensor asks for (bridges/torch_bridge.py).

Each runs ``python -P -c CODE ARGS`` in a session of its own, its standard streams on /dev/null, so
it keeps running after the caller exits and never writes to the caller's terminal. ``-P`` keeps the
caller's current directory off ``sys.path``: a ``torch/`` or ``json.py`` there is never imported.
It is started through ``sh``, which exits at once: the process is then the init process's child, and
the caller has no zombie to reap and no ``Popen`` left running (a ResourceWarning under ``-X dev``).
Without /bin/sh (a minimal image) it is started directly, and stays the caller's child.
"""
from __future__ import annotations

import os
import subprocess
import sys
from typing import List, Mapping, Optional, Sequence

_SH = "/bin/sh"
# sh starts the command in the background and prints its pid; the command's streams are /dev/null
_SPAWN = '"$@" </dev/null >/dev/null 2>&1 & echo $!'


def can_start() -> Optional[str]:
    """None if this process can start one, else why not: a frozen application (PyInstaller) or an
    embedded interpreter (uwsgi) has no Python executable to run, and would start itself again."""
    exe = sys.executable or ""
    if getattr(sys, "frozen", False) or not os.path.basename(exe).startswith(("python", "pypy")):
        return f"this process's executable ({exe or 'none'}) is not a Python interpreter"
    return None


# The first statement of a worker's code, its argv[1] the directory that holds the opbuilder package: put
# first only if it is not on the path already. site-packages put ahead of the standard library would let
# a stale backport there (enum34, typing) shadow it; a checkout run from its directory needs it.
ON_PATH = "import sys; sys.argv[1] in sys.path or sys.path.insert(0, sys.argv[1]); "

_kept: List[subprocess.Popen] = []  # started without sh: kept, so no Popen is collected while it runs


def start(code: str, args: Sequence[str], env: Mapping[str, str]) -> int:
    """Start ``python -P -c code *args`` detached, with ``env`` and umask 077; returns its pid.
    Raises OSError if it cannot be started (sh failing, a process limit, ...)."""
    argv = [sys.executable, "-P", "-c", code, *args]
    options = dict(env=dict(env), stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                   close_fds=True, umask=0o077)
    if not os.path.exists(_SH):  # a minimal image: our child then, until it ends or we exit
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, **options)
        _kept.append(proc)
        return proc.pid
    try:
        done = subprocess.run([_SH, "-c", _SPAWN, "sh", *argv], stdout=subprocess.PIPE, check=True, timeout=60,
                              **options)
        return int(done.stdout.split()[0])
    except (subprocess.SubprocessError, ValueError, IndexError) as e:
        raise OSError(f"could not start a detached Python process through {_SH}: {e}") from e
