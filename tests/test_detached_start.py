"""opbuilder/compile/detached.py: the processes that outlive their caller (the PCH's precompile, to_torch's
bridge build asked for by an operator's first torch tensor)."""
from __future__ import annotations

import os
import sys
import time

import pytest

from opbuilder.compile import detached


def _wait_for(path, seconds=60.0):
    deadline = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return path.exists()


def test_a_started_process_runs_apart_from_its_caller(tmp_path):
    done = tmp_path / "done"
    code = ("import os, sys; open(sys.argv[1] + '.tmp', 'w').write(repr([sys.path[0], os.getsid(0), os.getppid(), "
            "os.umask(0), sys.flags.safe_path])); os.replace(sys.argv[1] + '.tmp', sys.argv[1])")
    pid = detached.start(code, [str(done)], dict(os.environ))
    assert isinstance(pid, int) and pid > 0
    assert _wait_for(done), "the detached process did not run"
    first, sid, ppid, umask, safe_path = eval(done.read_text())
    assert safe_path and first != ""  # -P: the current directory is not on its sys.path
    assert sid != os.getsid(0) and ppid != os.getpid()  # its own session; not our child
    assert umask == 0o077  # (sh, which started it, was reaped: ppid is not ours, and no zombie is left)


def test_a_frozen_application_or_an_embedded_interpreter_starts_nothing(monkeypatch):
    assert detached.can_start() is None
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    assert detached.can_start() == f"this process's executable ({sys.executable}) is not a Python interpreter"
    monkeypatch.delattr(sys, "frozen")
    monkeypatch.setattr(sys, "executable", "/usr/bin/uwsgi")
    assert detached.can_start() == "this process's executable (/usr/bin/uwsgi) is not a Python interpreter"
    monkeypatch.setattr(sys, "executable", "")
    assert detached.can_start() == "this process's executable (none) is not a Python interpreter"


def test_a_shell_that_cannot_start_it_is_an_os_error(monkeypatch):
    """What the PCH's start catches (OSError): a process limit makes sh fail, as this does."""
    monkeypatch.setattr(detached, "_SPAWN", "exit 2")
    with pytest.raises(OSError, match=r"^could not start a detached Python process through /bin/sh: Command "):
        detached.start("pass", [], dict(os.environ))


def test_without_a_shell_it_is_started_directly(tmp_path, monkeypatch):
    done = tmp_path / "done"
    monkeypatch.setattr(detached, "_SH", str(tmp_path / "no-sh"))
    pid = detached.start("import os, sys; os.replace(sys.argv[1] + '.x', sys.argv[1]) if "
                         "open(sys.argv[1] + '.x', 'w').write(str(os.getsid(0))) else None", [str(done)],
                         dict(os.environ))
    assert _wait_for(done), "the detached process did not run"
    assert int(done.read_text()) == pid != os.getsid(0)  # a session of its own, led by it
