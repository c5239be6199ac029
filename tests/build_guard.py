"""The ``build`` marker: which tests start a compiler, so ``pytest -m "not build"`` runs the rest fast.

A test is marked ``build`` when it uses a fixture named in ``BUILD_FIXTURES`` (conftest.py) or is
marked by hand (``pytestmark`` or a decorator). The guard watches the processes that tests and
fixtures start, through Python's audit hook: a compiler or ninja started by an unmarked test, or by
a fixture (missing from ``BUILD_FIXTURES``) set up for an unmarked test, fails that test and names
the fix. A full run sees only the first user of a fixture; ``-m "not build"`` sees every one. So the
fast subset cannot start compiling without anyone noticing.

Child processes are watched too. The guard puts tests/build_guard_site first on PYTHONPATH, so
every Python child (and its children) runs that directory's sitecustomize.py, which installs the
same hook. All of them append to one log file per session (OPBUILDER_BUILD_GUARD_SPAWNS), each
line tagged with the fixture or test that was running when its process started
(OPBUILDER_BUILD_GUARD_PHASE): a detached child (a precompiled header's build) that compiles
later is blamed on the test that started it. A test that hands its child an environment of its
own gets the variables put back into it (the hook sees the env it is given).
A compiler started by a program that is not Python, with no Python or ninja between, is not seen.

``OPBUILDER_BUILD_GUARD=report:<file>`` appends the offenders to ``<file>`` instead of failing.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, FrozenSet, Iterator, List

import pytest

_SITE = Path(__file__).resolve().parent / "build_guard_site"


def _load_watch():
    """The child's sitecustomize.py, loaded under another name: one hook for this process and its children."""
    spec = importlib.util.spec_from_file_location("_build_guard_watch", _SITE / "sitecustomize.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_watch = _load_watch()


def _violation(what: str, fix: str, spawned: List[str]) -> None:
    seen = ", ".join(spawned)
    target = os.environ.get("OPBUILDER_BUILD_GUARD", "")
    if target.startswith("report:"):
        with open(target[len("report:"):], "a") as f:
            f.write(f"{what}: {seen}\n")
        return
    raise AssertionError(f"{what} starts a compiler ({seen}) but is not part of the build set: {fix}")


class BuildGuard:
    """The pytest plugin; conftest.py registers one with the fixtures that compile."""

    def __init__(self, build_fixtures: FrozenSet[str]) -> None:
        self.build_fixtures = build_fixtures
        self._count = 0
        self._dir = tempfile.mkdtemp(prefix="opbuilder-build-guard-")
        self.log = os.path.join(self._dir, "spawns")
        open(self.log, "w").close()
        os.environ[_watch.ENV] = self.log
        path = os.environ.get("PYTHONPATH", "")
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_watch.HERE, path) if p)
        sys.addaudithook(_watch.record(self.log))

    def _size(self) -> int:
        try:
            return os.path.getsize(self.log)
        except OSError:
            return 0

    def _spawned(self, since: int, phase: str) -> List[str]:
        """The compilers ``phase`` started since the log had ``since`` bytes: ``name`` when this process
        started it, ``name (child <pid>)`` when a child did."""
        if self._size() <= since:
            return []
        with open(self.log, "rb") as f:
            f.seek(since)
            lines = f.read().decode(errors="replace").splitlines()
        me = str(os.getpid())
        return [name if pid == me else f"{name} (child {pid})"
                for tag, pid, name in (ln.split(" ", 2) for ln in lines if ln.count(" ") >= 2) if tag == phase]

    @contextmanager
    def _phase(self) -> Iterator[Callable[[], List[str]]]:
        """Tag what starts while the block runs; yields a function giving the compilers it started."""
        self._count += 1
        phase, before, old = f"{self._count}", self._size(), os.environ.get(_watch.PHASE)
        os.environ[_watch.PHASE] = phase
        try:
            yield lambda: self._spawned(before, phase)
        finally:
            if old is None:
                os.environ.pop(_watch.PHASE, None)
            else:
                os.environ[_watch.PHASE] = old

    @pytest.hookimpl
    def pytest_collection_modifyitems(self, items) -> None:
        for item in items:
            if self.build_fixtures.intersection(item.fixturenames):
                item.add_marker(pytest.mark.build)

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        with self._phase() as spawned:
            result = yield
            started = spawned()
        # the test that asked for it (request.node is its module or session for wider scopes)
        item = getattr(request, "_pyfuncitem", None) or request.node
        if started and fixturedef.argname not in self.build_fixtures and item.get_closest_marker("build") is None:
            _violation(f"fixture {fixturedef.argname!r} ({fixturedef.baseid or 'conftest'})",
                       "add its name to BUILD_FIXTURES in tests/conftest.py", started)
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        with self._phase() as spawned:
            result = yield
            started = spawned()
        if started and item.get_closest_marker("build") is None:
            _violation(f"test {item.nodeid}", "mark it @pytest.mark.build (or its module: pytestmark)", started)
        return result

    @pytest.hookimpl
    def pytest_unconfigure(self, config) -> None:
        os.environ.pop(_watch.ENV, None)  # the hooks stay (they cannot be removed) and find no log
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != _watch.HERE)
        if not os.environ["PYTHONPATH"]:
            del os.environ["PYTHONPATH"]
        try:
            os.unlink(self.log)
            os.rmdir(self._dir)
        except OSError:
            pass
