"""A non-editable install (a built wheel) carries the headers and works on its own."""
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    # what the wheel packs, not its native runtime (tests/test_shipping.py builds that): no compiler here
    env = {**os.environ, "OPBUILDER_SKIP_NATIVE": "1"}
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(out), str(ROOT)], capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr
    (whl,) = out.glob("opbuilder-*.whl")
    return whl


def test_readme_and_pyproject_ask_for_the_python_the_tests_run_on():
    import re
    import tomllib

    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    floor = re.fullmatch(r">=(\d+)\.(\d+)", spec)
    assert floor is not None, spec
    readme = re.search(r"On a machine with Python (\d+)\.(\d+)\b", (ROOT / "README.md").read_text())
    assert readme is not None
    assert readme.groups() == floor.groups()  # the README's set-up line says what the package requires
    assert sys.version_info[:2] >= tuple(map(int, floor.groups()))  # and these tests run on a Python it allows


def test_wheel_contains_packages_headers_and_examples(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for must in ["opbuilder/__init__.py", "runtime/__init__.py", "opbuilder/include/opbuilder/extension.h",
                 "opbuilder/include/ms_extension.h", "opbuilder/custom_src/function_ops.cpp",
                 "opbuilder/include/opbuilder/aot.h", "runtime/ops/aot_call.cpp", "opbuilder/custom_src/aot_add.cpp",
                 "opbuilder/src/core/core_lib.cpp",  # the core library's sources (core_lib.py)
                 "opbuilder/src/core/tensor.cpp", "opbuilder/src/torch_bridge.cpp"]:
        assert must in names, must


@pytest.mark.build
def test_installed_copy_builds_and_runs_the_demo(wheel, tmp_path):
    site = tmp_path / "site"
    res = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
                          str(wheel)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    code = ("import opbuilder, runtime\n"
            f"assert opbuilder.__file__.startswith({str(site)!r}), opbuilder.__file__\n"
            f"assert str(opbuilder.include_dir()).startswith({str(site)!r})\n"
            "from opbuilder.demo import run_demo\n"
            "out, grads = run_demo(name='wheel_ops')\n")
    env = dict(os.environ, PYTHONPATH=str(site))  # the installed copy comes before the checkout
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[:3] == [
        "out: 12.0",
        "grads[0]: (Tensor(shape=[], dtype=Float32, value= 6), Tensor(shape=[], dtype=Float32, value= 4))",
        "grads[1]: (Tensor(shape=[], dtype=Float32, value= 6),)",
    ]


@pytest.mark.build
def test_installed_copy_runs_an_aot_op(wheel, tmp_path):
    site = tmp_path / "site"
    res = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
                          str(wheel)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    src = site / "opbuilder" / "custom_src" / "aot_add.cpp"
    code = ("import runtime as rt\n"
            f"assert rt.__file__.startswith({str(site)!r}), rt.__file__\n"
            f"op = rt.ops.Custom({str(src) + ':CustomAdd'!r}, out_shape=[2], out_dtype=rt.float32)\n"
            "print(op(rt.Tensor([1.0, 2.0]), rt.Tensor([3.0, 5.0])).asnumpy().tolist())\n")
    env = dict(os.environ, PYTHONPATH=str(site), OPBUILDER_CACHE_DIR=str(tmp_path / "cache"))
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[0] == "[4.0, 7.0]"
