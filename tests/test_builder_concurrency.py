"""Real processes: concurrent cold loads compile once; a build killed with SIGKILL
leaves nothing that the next load waits on or trusts."""
import ctypes
import os
import signal
import subprocess
import time

import pytest

from builder_util import PYTHON, child_env, compiled_sources, process_gone, tiny_module, wrapper_cxx
from opbuilder import build_library

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)

CHILD = """
import os, sys, time
import runtime
from opbuilder import CustomOpBuilder
ready, go = sys.argv[1], sys.argv[2]
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.005)
m = CustomOpBuilder("shared_op", [sys.argv[3]]).load()
print(m.value(), m.__file__)
"""


def test_four_concurrent_cold_loads_compile_once(tmp_path):
    log = tmp_path / "cxx.log"
    cxx = wrapper_cxx(tmp_path, log)
    slow_cxx = tmp_path / "slow-cxx.sh"  # a compile that lasts long enough for every loader to arrive
    slow_cxx.write_text(f"#!/bin/sh\ncase \" $* \" in *\" -c \"*) sleep 2;; esac\nexec '{cxx}' \"$@\"\n")
    slow_cxx.chmod(0o755)
    src = tiny_module(tmp_path / "shared_op.cpp", "42")
    env = child_env(CXX=str(slow_cxx), OPBUILDER_CACHE_DIR=str(tmp_path / "cache"))
    go = tmp_path / "go"
    procs = [subprocess.Popen([PYTHON, "-c", CHILD, str(tmp_path / f"ready{i}"), str(go), str(src)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(4)]
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"ready{i}").exists() for i in range(4)):
        assert time.monotonic() < deadline, "the loader processes did not start"
        time.sleep(0.01)
    go.touch()  # all four call load() at the same moment
    results = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err for _, err in results]
    outs = {out.strip() for out, _ in results}
    assert len(outs) == 1 and outs.pop().startswith("42 ")  # one working module, the same file for all
    assert compiled_sources(log) == ["shared_op.cpp"]  # exactly one compile
    assert sum("waiting for another process that is building shared_op" in err for _, err in results) >= 1


BUILD_VICTIM = """
import sys
from opbuilder import build_library
build_library("victim", [sys.argv[1]], build_dir=sys.argv[2])
"""


@pytest.mark.parametrize("target", ["process group", "python process"])
def test_sigkill_mid_build_leaves_nothing_to_wait_on_or_trust(tmp_path, monkeypatch, capfd, target):
    log = tmp_path / "cxx.log"
    stall = tmp_path / "stall"
    cxx = wrapper_cxx(tmp_path, log, stall_flag=stall, daemons=True)
    src = tmp_path / "victim.cpp"
    src.write_text('extern "C" int victim_value() { return 31; }\n')
    cache = tmp_path / "cache"
    stall.touch()
    child = subprocess.Popen([PYTHON, "-c", BUILD_VICTIM, str(src), str(cache)], env=child_env(CXX=cxx),
                             start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started = stall.with_name("stall.started")
    deadline = time.monotonic() + 120
    while not started.exists():
        assert child.poll() is None and time.monotonic() < deadline, "the build never reached the compiler"
        time.sleep(0.01)
    if target == "process group":
        os.killpg(child.pid, signal.SIGKILL)
    else:
        os.kill(child.pid, signal.SIGKILL)
    child.wait()
    compiler = int(stall.with_name("stall.pid").read_text())
    # servers the compiler wrapper started (they carry the build's environment too)
    daemons = [int(stall.with_name(f"stall.daemon-{kind}").read_text()) for kind in ("cwd", "session")]
    try:
        assert not process_gone(compiler)  # ninja runs commands in their own group: the compiler outlived the kill
        from opbuilder.cache.lock import try_lock
        with try_lock(cache / "victim.lib") as free:  # nothing holds the lock: a new build starts at once
            assert free, "the killed build's lock is still held (by the dead process or the leftover compiler)"
        stall.unlink()

        capfd.readouterr()
        monkeypatch.setenv("CXX", cxx)
        lib = build_library("victim", [src], build_dir=cache)  # would hang or link garbage if anything were trusted
        err = capfd.readouterr().err
        assert "waiting for another process" not in err
        assert ctypes.CDLL(lib).victim_value() == 31
        assert process_gone(compiler)  # the leftover compiler was stopped before the rebuild
        assert not (cache / "victim.lib" / "build" / ".building").exists()
        # a server that works in another directory or in a session of its own is not a leftover
        assert [process_gone(pid) for pid in daemons] == [False, False]
    finally:
        for pid in daemons:
            if not process_gone(pid):
                os.kill(pid, signal.SIGKILL)


NO_FLOCK = """\
#include <errno.h>
extern "C" int flock(int, int) { errno = ENOSYS; return -1; }  // a file system without flock(2)
"""


def test_a_file_system_without_flock_is_an_error_naming_the_directory_not_a_soft_lock(tmp_path):
    # a soft lock (a file whose existence means locked) outlives a SIGKILL and blocks every later build
    from builder_util import REAL_CXX

    shim = tmp_path / "no_flock.so"
    (tmp_path / "no_flock.cpp").write_text(NO_FLOCK)
    subprocess.run([REAL_CXX, "-shared", "-fPIC", "-o", str(shim), str(tmp_path / "no_flock.cpp")], check=True)
    log = tmp_path / "cxx.log"
    src = tmp_path / "unlocked.cpp"
    src.write_text('extern "C" int unlocked() { return 1; }\n')
    cache = tmp_path / "cache"
    res = subprocess.run([PYTHON, "-m", "opbuilder", "build", "unlocked", str(src), "--library",
                          "--cache-dir", str(cache)], capture_output=True, text=True, timeout=300,
                         env=child_env(CXX=wrapper_cxx(tmp_path, log), LD_PRELOAD=str(shim)))
    op_dir = cache / "unlocked.lib"
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert (f"opbuilder: error: building operator 'unlocked' failed: cannot lock {op_dir / '.lock'}: "
            f"the file system of {op_dir} does not support flock(2)") in res.stderr
    assert "OPBUILDER_CACHE_DIR" in res.stderr
    # the way out on a shared file system: a node-local cache and a read-only store on the shared one
    assert "OPBUILDER_PREBUILT_DIR=DIR; see docs/fleet.md" in res.stderr
    assert compiled_sources(log) == [] and not (op_dir / "build").exists()
    assert (cache / "toolchains.json").is_file()  # probes are still remembered (merged without the lock)
