"""Waiting for another process's build: who holds the lock, whether it is stopped (Ctrl-Z), and
giving up after OPBUILDER_LOCK_TIMEOUT. Real processes: a holder that is SIGSTOPped or released."""
import os
import signal
import subprocess
import time

import pytest

from builder_util import PYTHON, child_env, tiny_module

pytestmark = pytest.mark.build  # every test here compiles, some in child processes (tests/build_guard.py)

HOLDER = """
import sys, time
from pathlib import Path
from opbuilder.cache.lock import build_lock
from opbuilder.cache.trust import make_dir
op_dir = make_dir(Path(sys.argv[1]))
with build_lock(op_dir, "held_op"):
    open(sys.argv[2], "w").close()
    while not Path(sys.argv[3]).exists():
        time.sleep(0.02)
"""

LOAD = """
import sys
from opbuilder import BuildError, CustomOpBuilder
try:
    print(CustomOpBuilder("held_op", [sys.argv[1]], build_dir=sys.argv[2]).load().value())
except BuildError as e:
    print("BuildError:", e)
"""


@pytest.fixture
def holder(tmp_path):
    """A process holding the build lock of held_op until ``release`` exists: (process, cache, release)."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    ready, release = tmp_path / "ready", tmp_path / "release"
    proc = subprocess.Popen([PYTHON, "-c", HOLDER, str(cache / "held_op"), str(ready), str(release)],
                            env=child_env())
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the lock holder did not start"
        time.sleep(0.01)
    yield proc, cache, release
    proc.send_signal(signal.SIGCONT)
    proc.kill()
    proc.wait()


def test_a_stopped_lock_holder_is_named_and_the_wait_gives_up(holder, tmp_path):
    proc, cache, _ = holder
    os.kill(proc.pid, signal.SIGSTOP)  # Ctrl-Z in the holder's terminal
    src = tiny_module(tmp_path / "held_op.cpp", "3")
    res = subprocess.run([PYTHON, "-c", LOAD, str(src), str(cache)], capture_output=True, text=True, timeout=300,
                         env=child_env(OPBUILDER_LOCK_TIMEOUT="1.5"))
    assert res.returncode == 0, res.stderr
    assert (f"opbuilder: waiting for another process that is building held_op (pid {proc.pid}, stopped); "
            f"giving up after 1.5 s (OPBUILDER_LOCK_TIMEOUT)") in res.stderr
    assert f"is stopped (Ctrl-Z or SIGSTOP) and will not finish until it is continued (kill -CONT {proc.pid}" \
        in res.stderr
    assert res.stdout.startswith(f"BuildError: building operator 'held_op' failed: gave up after waiting 1.5 s "
                                 f"(OPBUILDER_LOCK_TIMEOUT) for the build lock {cache / 'held_op' / '.lock'}, "
                                 f"held by another process (pid {proc.pid}, stopped); process {proc.pid} is "
                                 f"stopped: continue it"), res.stdout


def test_a_running_lock_holder_is_named_and_waited_for(holder, tmp_path):
    proc, cache, release = holder
    src = tiny_module(tmp_path / "held_op.cpp", "4")
    loader = subprocess.Popen([PYTHON, "-c", LOAD, str(src), str(cache)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=child_env(OPBUILDER_LOCK_TIMEOUT="120"))
    try:
        line = loader.stderr.readline()  # the loader waits: it says so, and for whom (at most 120 s)
        assert line == (f"opbuilder: waiting for another process that is building held_op (pid {proc.pid}, "
                        f"running); giving up after 120 s (OPBUILDER_LOCK_TIMEOUT)\n")
        release.touch()
        out, err = loader.communicate(timeout=300)
    finally:
        if loader.poll() is None:
            loader.kill()
    assert loader.returncode == 0, err
    assert out.strip() == "4"  # built once the holder let go
    assert "stopped" not in err


def test_a_timeout_with_a_running_holder_says_to_load_again(holder, tmp_path):
    proc, cache, _ = holder
    src = tiny_module(tmp_path / "held_op.cpp", "5")
    res = subprocess.run([PYTHON, "-c", LOAD, str(src), str(cache)], capture_output=True, text=True, timeout=300,
                         env=child_env(OPBUILDER_LOCK_TIMEOUT="0.5"))
    assert res.returncode == 0, res.stderr
    assert f"held by another process (pid {proc.pid}, running); load again once that build is done" in res.stdout
