"""The build guard (tests/build_guard.py) sees compilers started by child processes, grandchildren and
children given an environment of their own, and blames each on the test or fixture that started it.
An inner pytest session runs a file of tests that start a fake ``g++``; the guard reports to a file."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parent

CONFTEST = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
from build_guard import BuildGuard

def pytest_configure(config):
    config.pluginmanager.register(BuildGuard(frozenset({{"listed"}})), "build_guard")
"""

INNER = """
import os, subprocess, sys, time
import pytest

FAKE = os.environ["FAKE_BIN"]
RUN_GXX = "import subprocess; subprocess.run(['g++', '--version'], check=True)"


def child(code=RUN_GXX, own_env=False):
    env = {"PATH": FAKE} if own_env else dict(os.environ, PATH=FAKE)
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


@pytest.fixture
def unlisted():
    child()


@pytest.fixture
def listed():
    child()


def test_child():
    child()


def test_child_with_an_environment_of_its_own():
    child(own_env=True)


def test_grandchild_with_an_environment_of_its_own():
    child(f"import subprocess, sys; subprocess.run([sys.executable, '-c', {RUN_GXX!r}], env={{'PATH': {FAKE!r}}}, "
          f"check=True)", own_env=True)


def test_fixture(unlisted):
    pass


def test_listed_fixture(listed):
    pass


@pytest.mark.build
def test_marked():
    child()


@pytest.mark.build
def test_marked_leaves_a_detached_child():
    flag = os.path.join(FAKE, "go")
    code = (f"import os, subprocess, time\\nwhile not os.path.exists({flag!r}): time.sleep(0.01)\\n"
            f"subprocess.run(['g++', 'detached'], check=True)")
    subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ, PATH=FAKE), start_new_session=True)


def test_runs_while_the_detached_child_compiles():
    flag = os.path.join(FAKE, "go")
    open(flag, "w").close()
    ran = os.path.join(FAKE, "ran-detached")
    for _ in range(3000):  # the child sees the flag and starts its compiler meanwhile
        if os.path.exists(ran):
            break
        time.sleep(0.01)
    assert os.path.exists(ran)


def test_child_that_compiles_nothing():
    child("pass")
"""


def test_the_guard_sees_compilers_started_by_children_and_blames_the_right_test(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "g++").write_text(f"#!/bin/sh\n[ \"$1\" = detached ] && : > '{fake}/ran-detached'\nexit 0\n")
    (fake / "g++").chmod(0o755)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(INNER))
    report = tmp_path / "report.txt"
    env = dict(os.environ, FAKE_BIN=str(fake), OPBUILDER_BUILD_GUARD=f"report:{report}")
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                          str(tmp_path / "test_inner.py")], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = sorted(report.read_text().splitlines())
    blamed = [line.split(": ", 1)[0] for line in lines]
    assert blamed == ["fixture 'unlisted' (test_inner.py)",
                      "test test_inner.py::test_child",
                      "test test_inner.py::test_child_with_an_environment_of_its_own",
                      "test test_inner.py::test_grandchild_with_an_environment_of_its_own"], lines
    assert all(line.split(": ", 1)[1].startswith("g++ (child ") for line in lines), lines
