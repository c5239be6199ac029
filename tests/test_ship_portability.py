"""One operator binary across torch versions (issue 35, item 5): examples/shipped_pkg's wheel, built once,
runs unchanged under this torch and under a second torch version, with no compiler: the same file
(same SHA-256), right values and gradients through to_torch, no child process, nothing written to
the cache. The torch bridge (which links libtorch) builds per torch; where it cannot be built (no
compiler) the operator stays on the registered path, with its right results.

The second torch is a venv of this Python with another torch version, named by
OPBUILDER_SECOND_TORCH_PYTHON (its python). This machine has torch 2.14.1 for Python 3.11 on disk:
``python3.11 -m venv V && V/bin/pip install torch==2.14.1 numpy``. CI has none: those tests skip,
saying so."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ship_util import NO_CXX, shipped_site, wheel_env

pytestmark = pytest.mark.build  # the wheels are built once per run (tests/ship_util.py)

SECOND = "OPBUILDER_SECOND_TORCH_PYTHON"

# runs in each torch's process, from the installed wheels: the op's results and what the process did
CHECK = textwrap.dedent("""\
    import hashlib, json, os, sys, warnings
    import torch  # first: a CUDA build of torch runs ldconfig on import, which is torch's, not ours
    spawned = []
    sys.addaudithook(lambda e, a: spawned.append(e) if e in ("subprocess.Popen", "os.posix_spawn", "os.fork",
                                                               "os.exec", "os.system") else None)
    import opbuilder, shipped_pkg
    from opbuilder.bridges import torch_bridge as bridge
    ops = opbuilder.to_torch(shipped_pkg.ops)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, dtype=torch.float64, generator=g, requires_grad=True)
    y = torch.randn(6, dtype=torch.float64, generator=g, requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = bridge.ready(wait=True) if bridge.enabled() else None
    z = ops.sq_mul(x, y)
    (z * torch.arange(1.0, 7.0, dtype=torch.float64)).sum().backward()
    w = torch.arange(1.0, 7.0, dtype=torch.float64)
    lib = shipped_pkg.ops.__file__
    print(json.dumps({
        "torch": torch.__version__, "python": sys.version_info[:2], "library": lib,
        "sha256": hashlib.sha256(open(lib, "rb").read()).hexdigest(),
        "value_err": float((z - x * x * y).abs().max()),
        "gx_err": float((x.grad - 2 * x * y * w).abs().max()), "gy_err": float((y.grad - x * x * w).abs().max()),
        "bridge": bridge.status(), "bridge_loaded": loaded is not None,
        "warnings": [str(m.message) for m in caught], "spawned": spawned}))
    """)


def _second_python() -> str:
    py = os.environ.get(SECOND, "")
    if not py:
        pytest.skip(f"no second torch: set {SECOND} to the python of a venv of Python "
                    f"{sys.version_info[0]}.{sys.version_info[1]} with another torch version (this machine has torch "
                    f"2.14.1 on disk: python -m venv V && V/bin/pip install torch==2.14.1 numpy); CI has none")
    if not os.access(py, os.X_OK):
        pytest.skip(f"{SECOND}={py} is not an executable Python")
    return py


def _check(python: str, site: Path, cache: Path, bridge: str, compiler: bool = False) -> dict:
    """CHECK's figures from ``python`` with the wheels of ``site``; without ``compiler``, CXX=/bin/false and
    OPBUILDER_NO_BUILD=1."""
    env = {"OPBUILDER_TORCH_BRIDGE": bridge, "OPBUILDER_CACHE_DIR": str(cache), "CI": "1"}
    if not compiler:
        env.update(NO_CXX, OPBUILDER_NO_BUILD="1")
    res = subprocess.run([python, "-c", CHECK], capture_output=True, text=True, timeout=900, cwd=str(site),
                         env=wheel_env(site, env))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def site(cache_dir):
    pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")
    return shipped_site(cache_dir.parent)


def _pythons(which):
    return [sys.executable] if which == "this torch" else [_second_python()]


@pytest.mark.parametrize("which", ["this torch", "second torch"])
def test_the_shipped_binary_runs_with_no_compiler_and_starts_nothing(site, tmp_path, which):
    (python,) = _pythons(which)
    out = _check(python, site, tmp_path / "cache", bridge="0")
    assert out["library"].startswith(str(site))  # the wheel's binary, not a build
    assert out["value_err"] <= 1e-15 and out["gx_err"] <= 1e-14 and out["gy_err"] <= 1e-14, out
    assert out["spawned"] == []  # from `import opbuilder` on: no compiler, no probe, no child process at all
    assert not (tmp_path / "cache").exists()  # nothing written to the cache


@pytest.mark.parametrize("which", ["this torch", "second torch"])
def test_a_bridge_that_cannot_be_built_leaves_the_registered_path(site, tmp_path, which):
    (python,) = _pythons(which)
    out = _check(python, site, tmp_path / "cache", bridge="1")
    assert not out["bridge_loaded"] and out["bridge"].startswith("failed: NoBuildError"), out["bridge"]
    assert any("to_torch's C++ bridge could not be built, so calls take the Python path" in w
               for w in out["warnings"]), out["warnings"]
    assert out["value_err"] <= 1e-15 and out["gx_err"] <= 1e-14 and out["gy_err"] <= 1e-14, out


def test_one_binary_serves_both_torch_versions(site, tmp_path):
    second = _second_python()
    a = _check(sys.executable, site, tmp_path / "a" / "cache", bridge="0")
    b = _check(second, site, tmp_path / "b" / "cache", bridge="0")
    assert a["torch"] != b["torch"], f"{SECOND} runs the same torch ({a['torch']}): nothing is compared"
    assert a["python"] == b["python"]
    assert a["sha256"] == b["sha256"] and a["library"] == b["library"]  # one file, loaded by both


def test_the_bridge_is_built_per_torch_version(site, cache_dir):
    """With a compiler, each torch gets its own bridge in one cache (it links that torch's libtorch); the
    shipped operator is the same file under both."""
    second = _second_python()
    a = _check(sys.executable, site, cache_dir, bridge="1", compiler=True)
    b = _check(second, site, cache_dir, bridge="1", compiler=True)
    assert a["bridge_loaded"] and b["bridge_loaded"], (a["bridge"], b["bridge"])
    assert a["bridge"].startswith("loaded from ") and b["bridge"].startswith("loaded from ")
    assert a["bridge"] != b["bridge"]  # two bridges, one per torch build
    assert a["sha256"] == b["sha256"]
    for out in (a, b):
        assert out["value_err"] <= 1e-15 and out["gx_err"] <= 1e-14 and out["gy_err"] <= 1e-14, out
