"""A torch tensor passed straight to an operator asks for to_torch's C++ bridge (issue 38, goal 2).

The first such call in a process (no to_torch anywhere) calls ``torch_bridge.request``: the bridge is
loaded on a thread if the cache has it, so later torch tensors are read by its C++ ``peek`` instead of
torch's Python ``is_neg``; if the cache lacks it, its build starts in a detached process and the
caller's process compiles nothing. Each case runs in a new process: the request is once per process.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")

from builder_util import child_env  # noqa: E402
from op_util import CUSTOM_SRC  # noqa: E402

pytestmark = pytest.mark.build  # my_ops and the bridge compile (tests/build_guard.py)

# In the child: my_ops from the session's cache (build_dir), the bridge looked up in OPBUILDER_CACHE_DIR.
CHILD = """
import json, os, sys, threading, torch
from opbuilder import CustomOpBuilder
from opbuilder.bridges import torch_bridge as bridge
ops = CustomOpBuilder("my_ops", [{src!r}], build_dir={ops_cache!r}).load()
{then}
before = bridge.status()
x, y = torch.tensor([1.0, -2.0, 3.0]), torch.tensor([2.0, 5.0, -1.0])
first = ops.mul(x, y).asnumpy().tolist()
lookup = bridge._lookup
if lookup is not None:
    lookup.join()
neg = (torch.tensor([1 + 1j, 2 + 2j, 3 - 3j], dtype=torch.complex64)).conj().imag  # a negative view
try:
    children = os.waitpid(-1, os.WNOHANG) is not None  # a child left to reap (running, or a zombie)
except ChildProcessError:
    children = False
print(json.dumps({{"before": before, "first": first, "after": bridge.status(), "loaded": bridge.loaded() is not None,
                  "detached": bridge._detached, "build_thread": bridge._thread is not None,
                  "later": ops.mul(x, y).asnumpy().tolist(), "neg": ops.mul(neg, y).asnumpy().tolist(),
                  "children": children}}))
"""


def _run(ops_cache: Path, bridge_cache: Path, then: str = "", **env: str) -> dict:
    """CHILD's findings, run with ``env``; ``then`` runs once the operator is loaded."""
    code = CHILD.format(src=str(CUSTOM_SRC / "function_ops.cpp"), ops_cache=str(ops_cache), then=then)
    # -X dev: a subprocess left running, an unclosed file, ... is a ResourceWarning on stderr
    r = subprocess.run([sys.executable, "-X", "dev", "-c", code], capture_output=True, text=True, timeout=300,
                       env=child_env(OPBUILDER_CACHE_DIR=str(bridge_cache), **env))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["stderr"] = r.stderr
    return out


def _killed(pid: int) -> None:
    """Stop a detached build this test started (its process group: the compilers it started too)."""
    try:
        os.killpg(os.getpgid(pid), signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_a_straight_call_loads_the_cached_bridge_without_to_torch(my_ops, torch_bridge, cache_dir):
    got = _run(cache_dir, cache_dir, OPBUILDER_TORCH_BRIDGE="1")
    assert got["before"] == "not started"
    assert got["first"] == [2.0, -10.0, -3.0]  # the call that asked took the exchange path meanwhile
    assert got["loaded"], got["after"]
    assert got["after"].startswith("loaded from ") and str(cache_dir) in got["after"]
    assert not got["build_thread"] and got["detached"] is None  # found in the cache: nothing built
    assert got["later"] == [2.0, -10.0, -3.0]
    assert got["neg"] == [-2.0, -10.0, -3.0]  # peek refuses the negative view; the Python path resolves it
    assert got["stderr"] == ""


def test_a_straight_call_with_no_bridge_in_the_cache_builds_it_in_a_detached_process(my_ops, cache_dir, tmp_path):
    empty = tmp_path / "bridge-cache"
    got = _run(cache_dir, empty, OPBUILDER_TORCH_BRIDGE="1")
    pid = got["detached"]
    try:
        assert isinstance(pid, int), got
        assert not got["loaded"] and not got["build_thread"]  # this process compiles nothing
        assert got["after"] == f"building in a detached process (pid {pid}), for the next processes"
        assert got["first"] == got["later"] == [2.0, -10.0, -3.0]
        assert got["neg"] == [-2.0, -10.0, -3.0]
        assert got["stderr"] == ""  # no progress line, no warning in the caller's terminal
        assert not got["children"]  # started through sh, which exited: nothing for the caller to reap
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert cmdline[1:3] == [b"-P", b"-c"] and b"build_detached()" in cmdline[3], cmdline  # -P: no cwd on sys.path
        assert os.getsid(pid) != os.getsid(0)  # a session of its own: it outlives the caller, away from its terminal
        assert os.stat(f"/proc/{pid}").st_uid == os.getuid()
    finally:
        if isinstance(pid, int):
            _killed(pid)


NO_COMPILER = "import os; os.environ['CXX'] = '/nonexistent/g++'"  # after the operator's (warm) load


@pytest.mark.parametrize("env", [{"OPBUILDER_TORCH_BRIDGE": "0"},
                                 {"OPBUILDER_TORCH_BRIDGE": "1", "OPBUILDER_NO_BUILD": "1"},
                                 {"OPBUILDER_TORCH_BRIDGE": "1", "then": NO_COMPILER}],
                         ids=["bridge_off", "no_build", "no_compiler"])
def test_a_straight_call_where_no_bridge_may_be_built_starts_nothing(my_ops, cache_dir, tmp_path, env, request):
    case = request.node.callspec.id
    got = _run(cache_dir, tmp_path / "bridge-cache", **env)
    assert got["detached"] is None and not got["loaded"] and not got["build_thread"]
    assert got["first"] == got["later"] == [2.0, -10.0, -3.0]
    assert got["stderr"] == ""
    assert got["after"] == {"bridge_off": "off (OPBUILDER_TORCH_BRIDGE=0)",
                            "no_build": "not in the cache, and OPBUILDER_NO_BUILD=1 forbids building it",
                            "no_compiler": "not in the cache, and no C++ compiler here to build it"}[case]
    assert not (tmp_path / "bridge-cache" / "_opbuilder_torch_bridge.lib").exists()


def test_a_request_that_found_nothing_leaves_to_torchs_own_load_free(my_ops, torch_bridge, cache_dir, tmp_path):
    """request()'s miss (here under OPBUILDER_NO_BUILD, in an empty cache) must not stop ready(), which
    to_torch calls, from loading the bridge once the cache has it."""
    code = (f"import os, torch\n"
            f"from opbuilder import CustomOpBuilder\n"
            f"from opbuilder.bridges import torch_bridge as bridge\n"
            f"ops = CustomOpBuilder('my_ops', [{str(CUSTOM_SRC / 'function_ops.cpp')!r}], "
            f"build_dir={str(cache_dir)!r}).load()\n"
            f"ops.mul(torch.ones(2), torch.ones(2))\n"
            f"bridge._lookup.join()\n"
            f"assert bridge.loaded() is None, bridge.status()\n"
            f"os.environ['OPBUILDER_CACHE_DIR'] = {str(cache_dir)!r}\n"
            f"os.environ.pop('OPBUILDER_NO_BUILD')\n"
            f"print(bridge.ready(wait=True) is not None, bridge.status())\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=child_env(OPBUILDER_CACHE_DIR=str(tmp_path / "empty"), OPBUILDER_TORCH_BRIDGE="1",
                                     OPBUILDER_NO_BUILD="1"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("True loaded from "), r.stdout + r.stderr


def test_a_straight_call_while_another_process_builds_the_bridge_starts_no_second_build(my_ops, cache_dir, tmp_path):
    """A detached build started then would only wait for the lock, holding torch in memory: many short
    processes during one build would stack up."""
    from opbuilder.bridges.torch_bridge import MODULE
    from opbuilder.cache.lock import try_lock

    empty = tmp_path / "bridge-cache"
    op_dir = empty / f"{MODULE}.lib"
    op_dir.mkdir(parents=True, mode=0o700)
    empty.chmod(0o700)
    with try_lock(op_dir) as held:  # as the building process holds it
        assert held
        got = _run(cache_dir, empty, OPBUILDER_TORCH_BRIDGE="1")
    assert got["detached"] is None and not got["loaded"], got
    assert got["after"] == "not in the cache; another process is building it"
    assert got["first"] == got["later"] == [2.0, -10.0, -3.0]


FAILING_CXX = "g++ -include /nonexistent/opbuilder-test.h"  # a real compiler; every compile fails at once


def test_a_failed_detached_build_is_remembered_and_not_started_again(my_ops, cache_dir, tmp_path):
    """A detached build that fails writes why beside the bridge's builds, for that compiler and torch; a
    later process with the same ones starts none (each would be a silent, doomed compile)."""
    empty = tmp_path / "bridge-cache"
    code = "import sys; from opbuilder.bridges.torch_bridge import build_detached; sys.exit(build_detached())"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=child_env(OPBUILDER_CACHE_DIR=str(empty), CXX=FAILING_CXX))
    assert r.returncode == 1, r.stdout + r.stderr
    failed = empty / "_opbuilder_torch_bridge.lib" / ".detached-build.failed"
    said = failed.read_text()
    assert said.splitlines()[0].endswith("g++ -include /nonexistent/opbuilder-test.h"), said  # the compiler
    assert f"\ntorch {torch.__version__}\n" in said, said
    assert "BuildError" in said and "opbuilder-test.h" in said, said
    then = f"import os; os.environ['CXX'] = {FAILING_CXX!r}"
    got = _run(cache_dir, empty, then=then, OPBUILDER_TORCH_BRIDGE="1")
    assert got["detached"] is None and not got["loaded"], got
    assert got["after"] == (f"not in the cache; its background build failed today ({failed}); to_torch builds "
                            f"it in the foreground and says why it fails; `python -m opbuilder cache clean "
                            f"_opbuilder_torch_bridge` forgets the failure")
    assert got["first"] == got["later"] == [2.0, -10.0, -3.0]


def test_an_error_while_deciding_on_a_detached_build_is_kept_for_status_not_printed(my_ops, cache_dir, tmp_path):
    """The bridge's build lock cannot be taken (its lock file is a directory here; a read-only cache is
    another way): status() says so, and nothing reaches the caller's stderr."""
    empty = tmp_path / "bridge-cache"
    (empty / "_opbuilder_torch_bridge.lib" / ".lock").mkdir(parents=True, mode=0o700)
    empty.chmod(0o700)
    (empty / "_opbuilder_torch_bridge.lib").chmod(0o700)
    got = _run(cache_dir, empty, OPBUILDER_TORCH_BRIDGE="1")
    assert got["detached"] is None and not got["loaded"], got
    assert got["after"].startswith("not in the cache, and not built in the background: UnsafeCacheDirError: "), got
    assert got["stderr"] == ""
    assert got["first"] == got["later"] == [2.0, -10.0, -3.0]


def _fork_after_first_call(ops_cache: Path, in_child: str, **env: str) -> subprocess.CompletedProcess:
    """A new process (-X dev) whose first straight torch call is followed at once by a fork; the child
    runs ``in_child`` (indented lines) and exits; the parent prints the child's exit code."""
    code = (f"import faulthandler, os, torch\n"
            f"from opbuilder import CustomOpBuilder\n"
            f"ops = CustomOpBuilder('my_ops', [{str(CUSTOM_SRC / 'function_ops.cpp')!r}], "
            f"build_dir={str(ops_cache)!r}).load()\n"
            f"ops.mul(torch.ones(2), torch.ones(2))\n"
            f"pid = os.fork()\n"
            f"if pid == 0:\n"
            f"    faulthandler.dump_traceback_later(60, exit=True)\n"
            f"{in_child}"
            f"    os._exit(0)\n"
            f"print('parent', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n")
    return subprocess.run([sys.executable, "-X", "dev", "-c", code], capture_output=True, text=True, timeout=300,
                          env=child_env(OPBUILDER_TORCH_BRIDGE="1", **env))


def test_a_fork_right_after_the_first_straight_call_leaves_a_working_child(my_ops, torch_bridge, cache_dir):
    """request()'s thread imports the build pipeline; a fork in the middle would leave the child modules
    half imported, locked by a thread it does not have (every later import of them hangs)."""
    child = ("    import opbuilder.builder, opbuilder.cache.shipped, opbuilder.compile.ninja_run\n"
             "    from opbuilder.bridges import torch_bridge\n"
             "    print('child', ops.mul(torch.ones(2), torch.full((2,), 3.0)).asnumpy().tolist(), flush=True)\n")
    r = _fork_after_first_call(cache_dir, child, OPBUILDER_CACHE_DIR=str(cache_dir))
    assert r.stdout == "child [3.0, 3.0]\nparent 0\n", r.stdout + r.stderr


def test_a_failure_from_another_day_does_not_stop_a_new_background_build(my_ops, cache_dir, tmp_path):
    """A failure may have passed (a full disk, a killed compiler): after a day, one more build is tried."""
    from opbuilder.bridges.torch_bridge import _build_inputs

    empty = tmp_path / "bridge-cache"
    op_dir = empty / "_opbuilder_torch_bridge.lib"
    op_dir.mkdir(parents=True, mode=0o700)
    empty.chmod(0o700)
    failed = op_dir / ".detached-build.failed"
    failed.write_text(_build_inputs() + "BuildError: a full disk\n")
    old = failed.stat().st_mtime - 25 * 3600
    os.utime(failed, (old, old))
    got = _run(cache_dir, empty, OPBUILDER_TORCH_BRIDGE="1")
    pid = got["detached"]
    try:
        assert isinstance(pid, int), got
    finally:
        if isinstance(pid, int):
            _killed(pid)


def test_a_fork_right_after_a_first_straight_call_that_misses_the_cache_prints_nothing(my_ops, cache_dir, tmp_path):
    """On a miss the look-up takes the bridge's build lock (filelock, which registers fork hooks when first
    imported): a fork waiting for the look-up must not see those hooks half registered."""
    r = _fork_after_first_call(cache_dir, "", OPBUILDER_CACHE_DIR=str(tmp_path / "empty"), OPBUILDER_NO_BUILD="1")
    assert (r.stdout, r.stderr) == ("parent 0\n", "")
