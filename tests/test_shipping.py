"""Shipping operators (docs/shipping.md): opbuilder's own wheel carries its runtime, a package's wheel
carries its operators, and both serve another Python version with no compiler.

One session fixture builds, in pyenv's Python 3.12, opbuilder's wheel (its hatch hook compiles the
runtime, abi3) and the wheel of examples/shipped_pkg (opbuilder.build_meta, ``python -m build
--no-isolation``), then installs both into a Python 3.13 venv with ``CXX=/bin/false``. The venvs get
numpy etc. from pip (its cache, else the index). Where pyenv's 3.12 or 3.13 is missing the tests skip,
naming it.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List, Optional

import pytest

from op_util import ROOT

pytestmark = pytest.mark.build

EXAMPLE = ROOT / "examples" / "shipped_pkg"
NO_CXX = {"CXX": "/bin/false", "CC": "/bin/false"}
# what `import opbuilder` and a shipped operator's load() import of opbuilder (tests/test_shipping_imports.py)
SHIPPED_PATH_MODULES = ["opbuilder", "opbuilder.importer", "opbuilder.spec"]
FIX = ("Fix: install a wheel of the package built for this Python and opbuilder (python -m opbuilder wheel "
       "PKGDIR), or unset OPBUILDER_NO_BUILD to build it here")


def _pyenv(version: str) -> Path:
    """pyenv's Python ``version`` (say 3.12), or a skip naming it."""
    versions = Path(os.environ.get("PYENV_ROOT", "~/.pyenv")).expanduser() / "versions"
    found = sorted(versions.glob(f"{version}.*/bin/python"))
    if not found:
        pytest.skip(f"Python {version} is not installed with pyenv ({versions}/{version}.*): the shipping tests "
                    f"build under 3.12 and run under 3.13")
    return found[-1]


def _env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The environment of a venv's process: none of this checkout on its path (the build guard's
    directory stays), opbuilder's installed runtime on (conftest turns it off here)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPBUILDER_")}
    keep = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p.endswith("build_guard_site")]
    env["PYTHONPATH"] = os.pathsep.join(keep)
    for k in ("OPBUILDER_BUILD_GUARD_SPAWNS", "OPBUILDER_BUILD_GUARD_PHASE", "OPBUILDER_BUILD_GUARD"):
        if k in os.environ:
            env[k] = os.environ[k]
    env.update(extra or {})
    return env


def _run(cmd: List[str], cwd: Path, extra: Optional[Dict[str, str]] = None, check: bool = True
         ) -> subprocess.CompletedProcess:
    res = subprocess.run([str(c) for c in cmd], cwd=cwd, env=_env(extra), capture_output=True, text=True,
                         timeout=600)
    if check and res.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res


def _venv(python: Path, where: Path, packages: List[str]) -> Path:
    """A venv of ``python`` with ``packages`` from pip; its python. A skip when pip cannot get them."""
    subprocess.run([str(python), "-m", "venv", str(where)], check=True, timeout=120)
    py = where / "bin" / "python"
    res = _run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", *packages], where, check=False)
    if res.returncode != 0:
        pytest.skip(f"pip could not install {', '.join(packages)} into a {python} venv (no index or cache?): "
                    f"{res.stderr.strip()[-300:]}")
    return py


@pytest.fixture(scope="module")
def shipped(tmp_path_factory, cache_dir):
    """Both wheels built under 3.12, installed into a 3.13 venv with no compiler. The builds under 3.12
    compile through tests/compile_memo.py: the editable install's and `opbuilder wheel`'s compiles are
    the same as the wheels', and reuse their objects (their builds, links and records are real)."""
    from compile_memo import launcher_env
    memo = launcher_env(cache_dir.parent)
    py312, py313 = _pyenv("3.12"), _pyenv("3.13")
    d = tmp_path_factory.mktemp("ship")
    dist = d / "dist"
    v312 = _venv(py312, d / "v312", ["numpy", "nanobind", "pybind11", "ninja", "filelock", "safetensors", "ml_dtypes",
                                        "hatchling", "editables", "build"])
    # a copy of the checkout (others may edit it meanwhile), without what git ignores that would travel along
    tree = d / "opbuilder_src"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(".git", "__pycache__", ".pytest_cache", ".benchmarks",
                                                              "_native", "*.so", "build", "dist", ".venv*"))
    _run([v312, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", "-w", dist, tree], d, memo)
    (opbuilder_wheel,) = dist.glob("opbuilder-*.whl")
    _run([v312, "-m", "pip", "install", "-q", "--no-deps", opbuilder_wheel], d)
    src = d / "shipped_pkg"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("__pycache__", "build", "dist"))
    _run([v312, "-m", "build", "--wheel", "--no-isolation", "--outdir", dist, src], d, memo)
    (pkg_wheel,) = dist.glob("shipped_pkg-*.whl")
    v313 = _venv(py313, d / "v313", ["numpy"])
    _run([v313, "-m", "pip", "install", "-q", "--no-deps", opbuilder_wheel, pkg_wheel], d, NO_CXX)
    site = Path(_run([v313, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], d).stdout.strip())
    return SimpleNamespace(dir=d, v312=v312, v313=v313, site=site, opbuilder_wheel=opbuilder_wheel,
                           pkg_wheel=pkg_wheel, src=src, tree=tree, memo=memo)


# runs in the 3.13 venv: every process this one would start is recorded (none may be)
_VALUES = textwrap.dedent("""\
    import json, os, sys
    spawned = []
    sys.addaudithook(lambda e, a: spawned.append(e) if e in ("subprocess.Popen", "os.posix_spawn", "os.fork",
                                                               "os.exec", "os.system") else None)
    import numpy as np
    import runtime as rt
    import shipped_pkg
    loaded = sorted(m for m in sys.modules if m.startswith("opbuilder"))
    rng = np.random.default_rng(0)
    x0, y0 = rng.standard_normal(5), rng.standard_normal(5)
    x = rt.Parameter(rt.Tensor(x0, rt.float64))
    y = rt.Parameter(rt.Tensor(y0, rt.float64))
    out = shipped_pkg.sq_mul(x, y).asnumpy()
    gx, gy = rt.grad(lambda a, b: shipped_pkg.sq_mul(a, b).sum(), grad_position=(0, 1))(x, y)
    def f(a, b):
        return float(shipped_pkg.sq_mul(rt.Tensor(a, rt.float64), rt.Tensor(b, rt.float64)).asnumpy().sum())
    h, num_x, num_y = 1e-6, [], []
    for i in range(5):
        e = np.zeros(5); e[i] = h
        num_x.append((f(x0 + e, y0) - f(x0 - e, y0)) / (2 * h))
        num_y.append((f(x0, y0 + e) - f(x0, y0 - e)) / (2 * h))
    print(json.dumps({"file": shipped_pkg.ops.__file__, "spawned": spawned, "python": sys.version_info[:2],
                      "value_err": float(np.abs(out - x0 * x0 * y0).max()),
                      "gx_err": float(np.abs(gx.asnumpy() - np.array(num_x)).max()),
                      "gy_err": float(np.abs(gy.asnumpy() - np.array(num_y)).max()),
                      "cache": os.path.exists(os.environ["OPBUILDER_CACHE_DIR"]), "loaded": loaded,
                      "name_taken": "shipped_ops" in sys.modules["opbuilder.spec"].names_used}))
""")


def test_opbuilders_own_wheel_is_abi3_and_installs_its_runtime_with_no_compiler(shipped):
    assert shipped.opbuilder_wheel.name == "opbuilder-0.1.0-cp312-abi3-linux_x86_64.whl"
    native = shipped.site / "opbuilder" / "_native"
    record = json.loads((native / "native.json").read_text())
    assert record["abi"]["python"] == "abi3-cp312"
    assert sorted(record["files"]) == ["libnanobind.so", "libobcore.so"]
    assert all((native / f).is_file() for f in record["files"])
    # the precompiled extension.h for the first operator (native/pch.py), recorded with its size
    assert record["pch"]["size"] == (native / "pch.h.gch").stat().st_size > 0


def test_an_editable_install_builds_the_runtime_into_the_checkout(shipped, tmp_path):
    # what `pip install -e .` asks of the build backend (hatchling, with hatch_build.py): the editable wheel
    # points at the checkout (hatchling tags it py3-none-any whatever a hook says: it carries no binary),
    # and the runtime is built into the checkout's opbuilder/_native/
    code = f"from hatchling.build import build_editable; print(build_editable({str(tmp_path)!r}))"
    name = _run([shipped.v312, "-c", code], shipped.tree, shipped.memo).stdout.strip().splitlines()[-1]
    assert name == "opbuilder-0.1.0-py3-none-any.whl"
    record = json.loads((shipped.tree / "opbuilder" / "_native" / "native.json").read_text())
    assert record["abi"]["python"] == "abi3-cp312"
    assert all((shipped.tree / "opbuilder" / "_native" / f).is_file() for f in record["files"])


def test_a_wheel_built_under_312_runs_under_313_with_no_compiler(shipped, tmp_path):
    assert shipped.pkg_wheel.name == "shipped_pkg-0.1.0-cp312-abi3-linux_x86_64.whl"
    script = tmp_path / "values.py"
    script.write_text(_VALUES)
    res = _run([shipped.v313, script], tmp_path, {**NO_CXX, "OPBUILDER_CACHE_DIR": str(tmp_path / "cache")})
    got = json.loads(res.stdout)
    assert got["python"] == [3, 13]
    assert got["file"] == str(shipped.site / "shipped_pkg" / "_opbuilder" / "shipped_ops.abi3.so")
    assert got["spawned"] == [] and got["cache"] is False  # no compiler, no process, nothing written
    assert got["value_err"] < 1e-12
    assert got["gx_err"] < 1e-6 and got["gy_err"] < 1e-6  # central differences, float64
    # the import and load() ran none of the build pipeline (opbuilder/__init__.py): the modules a shipped load needs
    assert got["loaded"] == SHIPPED_PATH_MODULES, got["loaded"]
    # the shipped module holds its plain name: a rebuild in this process (a source edited) imports under a
    # name of its own, or pybind11 hands back the shipped module (fails on f2d235d)
    assert got["name_taken"] is True


def _copy_installed(shipped, where: Path) -> Path:
    """A copy of the installed package (to change without touching the venv's); its directory."""
    dst = where / "shipped_pkg"
    shutil.copytree(shipped.site / "shipped_pkg", dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


_LOAD = textwrap.dedent("""\
    import sys
    import opbuilder
    try:
        m = opbuilder.CustomOpBuilder("shipped_ops", [sys.argv[1]]).load()
        print("LOADED", m.__file__)
    except Exception as e:
        print(type(e).__module__ + "." + type(e).__qualname__)
        print(e)
""")


def _load_copy(python: Path, source: Path, tmp_path: Path, extra: Dict[str, str]) -> List[str]:
    script = tmp_path / "load.py"
    script.write_text(_LOAD)
    return _run([python, script, source], tmp_path, {"OPBUILDER_CACHE_DIR": str(tmp_path / "cache"), **extra}
                ).stdout.splitlines()


def test_no_build_names_the_operator_why_the_shipped_binary_did_not_fit_and_the_fix(shipped, tmp_path):
    pkg = _copy_installed(shipped, tmp_path)
    source = pkg / "csrc" / "sq_mul.cpp"
    source.write_text(source.read_text() + "\n// edited after the wheel was built\n")
    out = _load_copy(shipped.v313, source, tmp_path, {**NO_CXX, "OPBUILDER_NO_BUILD": "1"})
    assert out == ["opbuilder.errors.NoBuildError",
                   "operator 'shipped_ops' would have to be built, and OPBUILDER_NO_BUILD=1 forbids building: its "
                   "sources differ from those the binary was built from (csrc/sq_mul.cpp). " + FIX]
    assert not (tmp_path / "cache").exists()


def test_the_shipped_binary_carries_no_symbol_table(shipped, tmp_path):
    """build_meta ships the operator stripped (``strip --strip-unneeded``): a third less for every shipped
    load() to hash (issue 35); its dynamic symbols, which Python's import uses, stay."""
    data = (_copy_installed(shipped, tmp_path) / "_opbuilder" / "shipped_ops.abi3.so").read_bytes()
    assert b"PyInit_shipped_ops" in data
    assert b".symtab" not in data


def test_a_tampered_shipped_binary_is_refused_under_no_build(shipped, tmp_path):
    pkg = _copy_installed(shipped, tmp_path)
    binary = pkg / "_opbuilder" / "shipped_ops.abi3.so"
    data = bytearray(binary.read_bytes())
    data[-1] ^= 0xFF
    binary.write_bytes(bytes(data))
    out = _load_copy(shipped.v313, pkg / "csrc" / "sq_mul.cpp", tmp_path, {**NO_CXX, "OPBUILDER_NO_BUILD": "1"})
    assert out == ["opbuilder.errors.NoBuildError",
                   f"operator 'shipped_ops' would have to be built, and OPBUILDER_NO_BUILD=1 forbids building: its "
                   f"binary {binary} was modified after it was built (its hash is not the one recorded): it is never "
                   f"loaded. " + FIX]


def test_a_tampered_shipped_binary_is_rebuilt_with_a_warning_and_never_loaded(shipped, tmp_path):
    # the rebuild is a JIT build in a fresh cache: with the installed runtime it compiles only the operator,
    # with a compiler at another path (the runtime is keyed by the C++ ABI, not by the compiler's path)
    real = shutil.which("g++") or shutil.which("c++")
    if real is None:
        pytest.skip("no g++ or c++ on PATH to rebuild the operator with")
    cxx = tmp_path / "bin" / "g++"
    cxx.parent.mkdir()
    cxx.write_text(f'#!/bin/sh\nexec {real} "$@"\n')
    cxx.chmod(0o755)
    site312 = Path(_run([shipped.v312, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        tmp_path).stdout.strip())
    _run([shipped.v312, "-m", "pip", "install", "-q", "--no-deps", shipped.pkg_wheel], tmp_path)
    pkg = tmp_path / "shipped_pkg"
    shutil.copytree(site312 / "shipped_pkg", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    binary = pkg / "_opbuilder" / "shipped_ops.abi3.so"
    data = binary.read_bytes()
    binary.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))  # one byte changed
    script = tmp_path / "rebuild.py"
    script.write_text(textwrap.dedent("""\
        import sys
        import runtime as rt
        import opbuilder
        m = opbuilder.CustomOpBuilder("shipped_ops", [sys.argv[1]]).load()
        maps = open("/proc/self/maps").read()
        print(m.__file__)
        print(sys.argv[2] in maps)
        print(m.sq_mul(rt.Tensor([2.0], rt.float64), rt.Tensor([3.0], rt.float64)).asnumpy().tolist())
    """))
    res = _run([shipped.v312, script, pkg / "csrc" / "sq_mul.cpp", binary], tmp_path,
               {"OPBUILDER_CACHE_DIR": str(tmp_path / "cache"), "CXX": str(cxx)})
    file, mapped, value = res.stdout.splitlines()
    assert file.startswith(str(tmp_path / "cache" / "shipped_ops"))  # built into the cache
    assert not list((tmp_path / "cache").glob("*.lib"))  # no nanobind runtime or core library built there
    needs = json.loads((Path(file).parent / "build.json").read_text())["needs"]
    assert [(n["dir"], n["key"]) for n in needs] == [("_nanobind.lib", "installed"), ("_obcore.lib", "installed")]
    assert mapped == "False" and value == "[12.0]"
    assert (f"opbuilder: shipped_ops: its binary {binary} was modified after it was built (its hash is not the "
            f"one recorded): it is never loaded; building it instead") in res.stderr


def test_the_cli_builds_a_packages_wheel_with_pip(shipped, tmp_path):
    out = tmp_path / "wheels"
    _run([shipped.v312, "-m", "opbuilder", "wheel", shipped.src, "-w", out], tmp_path, shipped.memo)
    (wheel,) = out.glob("*.whl")
    assert wheel.name == "shipped_pkg-0.1.0-cp312-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        record = json.loads(z.read("shipped_pkg/opbuilder_ops.json"))
        wheel_meta = z.read("shipped_pkg-0.1.0.dist-info/WHEEL").decode()
    assert {"shipped_pkg/_opbuilder/shipped_ops.abi3.so", "shipped_pkg/csrc/sq_mul.cpp",
            "shipped_pkg/opbuilder_ops.json", "shipped_pkg/__init__.py"} <= names
    assert record["ops"]["shipped_ops"]["file"] == "_opbuilder/shipped_ops.abi3.so"
    assert "Root-Is-Purelib: false" in wheel_meta and "Tag: cp312-abi3-linux_x86_64" in wheel_meta


def test_doctor_reports_the_shipped_operator(shipped, tmp_path):
    res = _run([shipped.v313, "-m", "opbuilder", "doctor"], tmp_path,
               {**NO_CXX, "OPBUILDER_CACHE_DIR": str(tmp_path / "cache")}, check=False)
    binary = shipped.site / "shipped_pkg" / "_opbuilder" / "shipped_ops.abi3.so"
    assert f"ok    shipped operator: shipped_ops (shipped_pkg): load() uses {binary}, no compiler" in res.stdout
    assert f"ok    installed runtime: {shipped.site / 'opbuilder' / '_native'} (Python abi3-cp312" in res.stdout
