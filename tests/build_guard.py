"""The ``build`` marker: which tests start a compiler, so ``pytest -m "not build"`` runs the rest fast.

A test is marked ``build`` when it uses a fixture named in ``BUILD_FIXTURES`` (conftest.py) or is
marked by hand (``pytestmark`` or a decorator). The guard watches the processes that tests and
fixtures start, through Python's audit hook: a compiler or ninja started by an unmarked test, or by
a fixture (missing from ``BUILD_FIXTURES``) set up for an unmarked test, fails that test and names
the fix. A full run sees only the first user of a fixture; ``-m "not build"`` sees every one. So the fast subset
cannot start compiling without anyone noticing. Compilers started by child Python processes are not
seen: tests whose children compile are marked by hand (the seeds, installed copies, warm-process
checks).

``OPBUILDER_BUILD_GUARD=report:<file>`` appends the offenders to ``<file>`` instead of failing.
"""
from __future__ import annotations

import os
import re
import sys
from typing import FrozenSet, List

import pytest

# executables that compile or drive a compile: compilers by any version suffix, ninja, nvcc
_COMPILER = re.compile(r"^(ninja|nvcc|cc|c\+\+|g\+\+|gcc|clang|clang\+\+)(-[0-9.]+)?$")
_spawned: List[str] = []


def _audit(event: str, args: tuple) -> None:
    if event == "subprocess.Popen":
        argv = args[1]
        first = args[0] or (argv[0] if isinstance(argv, (list, tuple)) and argv else argv)
        name = os.path.basename(os.fsdecode(first)) if first else ""
        if _COMPILER.match(name):
            _spawned.append(name)


def _violation(what: str, fix: str) -> None:
    target = os.environ.get("OPBUILDER_BUILD_GUARD", "")
    if target.startswith("report:"):
        with open(target[len("report:"):], "a") as f:
            f.write(f"{what}\n")
        return
    raise AssertionError(f"{what} starts a compiler but is not part of the build set: {fix}")


class BuildGuard:
    """The pytest plugin; conftest.py registers one with the fixtures that compile."""

    def __init__(self, build_fixtures: FrozenSet[str]) -> None:
        self.build_fixtures = build_fixtures
        sys.addaudithook(_audit)

    @pytest.hookimpl
    def pytest_collection_modifyitems(self, items) -> None:
        for item in items:
            if self.build_fixtures.intersection(item.fixturenames):
                item.add_marker(pytest.mark.build)

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        before = len(_spawned)
        result = yield
        # the test that asked for it (request.node is its module or session for wider scopes)
        item = getattr(request, "_pyfuncitem", None) or request.node
        if (len(_spawned) > before and fixturedef.argname not in self.build_fixtures
                and item.get_closest_marker("build") is None):
            _violation(f"fixture {fixturedef.argname!r} ({fixturedef.baseid or 'conftest'})",
                       "add its name to BUILD_FIXTURES in tests/conftest.py")
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        before = len(_spawned)
        result = yield
        if len(_spawned) > before and item.get_closest_marker("build") is None:
            _violation(f"test {item.nodeid}", "mark it @pytest.mark.build (or its module: pytestmark)")
        return result
