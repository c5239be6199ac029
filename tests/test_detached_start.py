"""opbuilder/compile/detached.py: the processes that outlive their caller (the PCH's precompile, to_torch's
bridge build asked for by an operator's first torch tensor)."""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
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


def _path_in_worker(directory: str) -> list:
    code = detached.ON_PATH + "print(repr(sys.path))"
    return eval(subprocess.run([sys.executable, "-P", "-c", code, directory], capture_output=True, text=True,
                               check=True).stdout)


def test_a_worker_puts_the_packages_directory_first_only_when_it_is_missing(tmp_path):
    """site-packages (an installed opbuilder) put ahead of the standard library would let a stale backport
    there shadow it; a checkout run from its own directory is not on the path, and goes first."""
    plain = eval(subprocess.run([sys.executable, "-P", "-c", "import sys; print(repr(sys.path))"],
                                capture_output=True, text=True, check=True).stdout)
    site = sysconfig.get_paths()["purelib"]
    assert site in plain
    assert _path_in_worker(site) == plain
    assert _path_in_worker(str(tmp_path)) == [str(tmp_path), *plain]
