"""A shipped operator for the tests that run one in other processes (test_distributed.py,
test_ship_portability.py): opbuilder's wheel (its native runtime inside) and examples/shipped_pkg's wheel
(opbuilder.build_meta, the operator's binary inside), built once per test run under this Python and
installed into one directory with ``pip install --target``. A process with that directory first on
PYTHONPATH, and not this checkout, imports both as a user of the wheels would."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

from filelock import FileLock

from compile_memo import launcher_env
from op_util import ROOT

EXAMPLE = ROOT / "examples" / "shipped_pkg"
NO_CXX = {"CXX": "/bin/false", "CC": "/bin/false"}  # no compiler: what a build would run fails
_GUARD = ("OPBUILDER_BUILD_GUARD_SPAWNS", "OPBUILDER_BUILD_GUARD_PHASE", "OPBUILDER_BUILD_GUARD")


def wheel_env(site: Optional[Path], extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """A child's environment: ``site`` (the installed wheels) on PYTHONPATH instead of this checkout (the
    build guard's directory stays), no OPBUILDER_* setting of the test session but the guard's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPBUILDER_") or k in _GUARD}
    keep = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p.endswith("build_guard_site")]
    env["PYTHONPATH"] = os.pathsep.join(([str(site)] if site else []) + keep)
    env.update(extra or {})
    return env


def _run(cmd: List[str], env: Dict[str, str], cwd: Path) -> None:
    res = subprocess.run([str(c) for c in cmd], env=env, cwd=str(cwd), capture_output=True, text=True, timeout=900)
    if res.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} failed ({res.returncode}):\n{res.stdout[-3000:]}\n"
                             f"{res.stderr[-3000:]}")


def shipped_site(shared: Path) -> Path:
    """The directory holding both installed wheels, built on first use under ``shared`` (a directory of
    the test run; a lock lets one process build while others wait)."""
    work = shared / f"shipped-wheels-py{sys.version_info[0]}{sys.version_info[1]}"
    site = work / "site"
    with FileLock(str(work) + ".lock"):
        if (work / "done").exists():
            return site
        shutil.rmtree(work, ignore_errors=True)
        dist = work / "dist"
        dist.mkdir(parents=True)
        py = sys.executable
        pip = [py, "-m", "pip", "-q", "--disable-pip-version-check"]
        tmp = work / "tmp"  # the builds' temporary directories: each removes its own
        tmp.mkdir()
        # its compiles reuse those of tests/test_shipping_pch.py's build (the same files and Python), if first
        _run([*pip, "wheel", "--no-build-isolation", "--no-deps", "-w", dist, ROOT],
             wheel_env(None, {**launcher_env(shared), "TMPDIR": str(tmp)}), work)
        (opbuilder_wheel,) = dist.glob("opbuilder-*.whl")
        _run([*pip, "install", "--no-deps", "--target", site, opbuilder_wheel], wheel_env(None), work)
        src = work / "shipped_pkg"  # a copy: the build writes nothing into the checkout
        shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("__pycache__", "build", "dist", "*.egg-info"))
        _run([*pip, "wheel", "--no-build-isolation", "--no-deps", "-w", dist, src], wheel_env(site, {"TMPDIR": str(tmp)}),
             work)
        left = sorted(p.name for p in tmp.glob("opbuilder-wheel-*"))
        assert not left, f"the wheel builds left their temporary directories: {left}"  # (hatch_build.py leaked ~80 MB)
        (pkg_wheel,) = dist.glob("shipped_pkg-*.whl")
        _run([*pip, "install", "--no-deps", "--target", site, pkg_wheel], wheel_env(None), work)
        (work / "done").touch()
    return site
