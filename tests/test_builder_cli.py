"""python -m opbuilder build / cache list / cache clean / doctor, as a user runs them."""
import ctypes
import os
import subprocess
from pathlib import Path

import pytest

from builder_util import PYTHON, child_env, tiny_module


def _names(directory):
    return sorted(p.name for p in directory.iterdir())


def _cli(*args, **env):
    return subprocess.run([PYTHON, "-m", "opbuilder", *args], capture_output=True, text=True, timeout=300,
                          env=child_env(**env))


def _fix_after(lines, prefix):
    """The fix doctor prints under its line starting with ``prefix``."""
    i = next(i for i, line in enumerate(lines) if line.startswith(prefix))
    return lines[i + 1].strip()


@pytest.fixture
def cache(tmp_path):
    return tmp_path / "cli-cache"


@pytest.mark.build
def test_build_then_list_then_clean_one_operator(tmp_path, cache):
    src = tiny_module(tmp_path / "cli_op.cpp", "9")
    res = _cli("build", "cli_op", str(src), OPBUILDER_CACHE_DIR=str(cache))
    assert res.returncode == 0, res.stderr
    lib = Path(res.stdout.strip())
    assert lib.is_file() and cache in lib.parents and lib.name.startswith("cli_op.")
    # a load() in a new process finds the prebuilt module without building
    code = f"from opbuilder import CustomOpBuilder; print(CustomOpBuilder('cli_op', [{str(src)!r}]).load().value())"
    run = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=300,
                         env=child_env(OPBUILDER_CACHE_DIR=str(cache)))
    assert run.stdout.strip() == "9" and "building" not in run.stderr

    plain = tmp_path / "plain.cpp"
    plain.write_text('int other();\nextern "C" int plain() { return PLAIN + other(); }\n')
    other = tmp_path / "other.cpp"
    other.write_text("int other() { return 40; }\n")
    res = _cli("build", "cli_lib", str(plain), str(other), "--backend", "CPU", "--library", "--cflags=-DPLAIN=3",
               OPBUILDER_CACHE_DIR=str(cache))
    assert res.returncode == 0, res.stderr
    lib2 = Path(res.stdout.strip())
    assert lib2.name == "libcli_lib.so" and ctypes.CDLL(str(lib2)).plain() == 43  # both sources linked

    listing = _cli("cache", "list", OPBUILDER_CACHE_DIR=str(cache))
    assert listing.returncode == 0
    assert listing.stdout.splitlines()[0] == f"cache: {cache}"
    rows = {line.split()[0]: line.split()[1] for line in listing.stdout.splitlines() if line and line[0] != " "}
    assert rows.get("cli_op") == "module" and rows.get("cli_lib") == "library"
    one = _cli("cache", "list", "cli_op", OPBUILDER_CACHE_DIR=str(cache))
    assert str(lib) in one.stdout and str(src) in one.stdout and "cli_lib" not in one.stdout

    clean = _cli("cache", "clean", "cli_op", OPBUILDER_CACHE_DIR=str(cache))
    assert clean.returncode == 0 and f"removed {cache / 'cli_op'}" in clean.stdout
    assert _names(cache / "cli_op") == [".lock"] and lib2.is_file()  # the other operator is untouched
    gone = _cli("cache", "list", "cli_op", OPBUILDER_CACHE_DIR=str(cache))
    assert gone.returncode == 1 and "nothing cached for operator 'cli_op'" in gone.stderr

    everything = _cli("cache", "clean", OPBUILDER_CACHE_DIR=str(cache))
    assert everything.returncode == 0 and _names(cache / "cli_lib.lib") == [".lock"]
    after = _cli("cache", "list", OPBUILDER_CACHE_DIR=str(cache))
    assert after.returncode == 0 and after.stdout.splitlines()[1:] == ["total: 0 B"]


@pytest.mark.build  # the CLI child compiles (tests/build_guard.py)
def test_build_errors_are_printed_without_a_traceback(tmp_path, cache):
    src = tmp_path / "bad.cpp"
    src.write_text("int f() { return nope; }\n")
    res = _cli("build", "bad_op", str(src), "--library", OPBUILDER_CACHE_DIR=str(cache))
    assert res.returncode == 1
    assert "opbuilder: error: building operator 'bad_op' failed:" in res.stderr
    assert f"{src}:1:" in res.stderr and "Traceback" not in res.stderr
    res = _cli("build", "bad_op", str(tmp_path / "missing.cpp"), OPBUILDER_CACHE_DIR=str(cache))
    assert res.returncode == 1 and "source file of operator 'bad_op' not found" in res.stderr
    res = _cli("build", "bad_op", str(src), "--backend", "TPU", OPBUILDER_CACHE_DIR=str(cache))
    assert res.returncode == 1 and "unknown backend 'TPU'; accepted values: 'CPU', 'GPU'" in res.stderr


def test_cache_commands_refuse_a_shared_directory(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    for action in ("list", "clean"):
        res = _cli("cache", action, OPBUILDER_CACHE_DIR=str(shared))
        assert res.returncode == 1 and f"{shared} is writable by group or others" in res.stderr


@pytest.mark.build  # the doctor child runs the compilers' checks (tests/build_guard.py)
def test_doctor_reports_all_is_well(cache):
    res = _cli("doctor", OPBUILDER_CACHE_DIR=str(cache))
    assert res.returncode == 0, res.stdout
    for what in ("cache directory", "C++ compiler", "pybind11", "Python headers", "ninja", "parallel jobs"):
        assert any(line.startswith(f"ok    {what}: ") for line in res.stdout.splitlines()), what
    assert res.stdout.splitlines()[-1] == "everything a build needs is here"


@pytest.mark.build  # the doctor child runs the compilers' checks (tests/build_guard.py)
def test_doctor_names_each_problem_with_a_fix(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o775)
    res = _cli("doctor", OPBUILDER_CACHE_DIR=str(shared), CXX="/no/such/g++", MAX_JOBS="lots")
    assert res.returncode == 1
    lines = res.stdout.splitlines()

    assert _fix_after(lines, f"error cache directory: opbuilder cache directory {shared} is writable") == \
        f"fix: chmod 700 {shared} (if only you use it), or set OPBUILDER_CACHE_DIR to a private directory"
    assert _fix_after(lines, "error C++ compiler: CXX compiler '/no/such/g++' was not found") \
        .startswith("fix: install g++")
    assert _fix_after(lines, "error parallel jobs: MAX_JOBS must be a positive integer") == \
        "fix: set MAX_JOBS to a positive integer, or unset it"
    assert lines[-1] == "3 problem(s) found"


@pytest.mark.build  # the child compiles (tests/build_guard.py)
def test_clean_removes_the_sources_load_inline_wrote(cache):
    code = ("from opbuilder import load_inline; "
            "m = load_inline('cli_inl', cpp_sources='int seven() { return 7; }', functions=['seven']); "
            "print(m.seven())")
    run = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=300,
                         env=child_env(OPBUILDER_CACHE_DIR=str(cache)))
    assert run.stdout.strip() == "7", run.stderr
    assert (cache / "inline" / "cli_inl").is_dir()
    one = _cli("cache", "clean", "cli_inl", OPBUILDER_CACHE_DIR=str(cache))
    assert one.returncode == 0 and one.stdout.splitlines()[:2] == [f"removed {cache / 'cli_inl'}",
                                                                   f"removed {cache / 'inline' / 'cli_inl'}"]
    assert _names(cache / "inline") == []
    everything = _cli("cache", "clean", OPBUILDER_CACHE_DIR=str(cache))
    assert everything.returncode == 0 and f"removed {cache / 'inline'}" in everything.stdout.splitlines()
    assert not (cache / "inline").exists()


@pytest.mark.build  # the CLI child compiles (tests/build_guard.py)
def test_clean_skips_an_operator_that_is_being_built(tmp_path, cache):
    from opbuilder.cache.lock import build_lock

    src = tmp_path / "busy.cpp"
    src.write_text('extern "C" int busy() { return 1; }\n')
    assert _cli("build", "busy", str(src), "--library", OPBUILDER_CACHE_DIR=str(cache)).returncode == 0
    with build_lock(cache / "busy.lib", "busy"):  # as a running build holds it
        res = _cli("cache", "clean", "busy", OPBUILDER_CACHE_DIR=str(cache))
    assert res.returncode == 1 and "skipped busy: being built by another process right now" in res.stderr
    assert (cache / "busy.lib").is_dir()
    assert _cli("cache", "clean", "busy", OPBUILDER_CACHE_DIR=str(cache)).returncode == 0
    assert _names(cache / "busy.lib") == [".lock"]


@pytest.mark.build  # the CLI child compiles (tests/build_guard.py)
def test_clean_keeps_what_a_running_build_uses(tmp_path, cache):
    """Before, `cache clean` skipped the operator being built but removed nanobind's runtime and the core
    library ("_" libraries), the PCH and load_inline's sources, which that build links, preloads or
    compiles: the build failed ("libnanobind.so: cannot open shared object file")."""
    from opbuilder.cache.lock import build_lock

    src = tmp_path / "busy.cpp"
    src.write_text('extern "C" int busy() { return 1; }\n')
    for name in ("busy", "_shared"):  # "_shared" stands for opbuilder's own libraries
        assert _cli("build", name, str(src), "--library", OPBUILDER_CACHE_DIR=str(cache)).returncode == 0
    for d in (".pch", "inline"):
        (cache / d).mkdir(exist_ok=True)
    with build_lock(cache / "busy.lib", "busy"):  # as a running build holds it
        res = _cli("cache", "clean", OPBUILDER_CACHE_DIR=str(cache))
    assert res.returncode == 1
    assert res.stderr.strip() == ("opbuilder: skipped busy: being built by another process right now; kept _shared, "
                                  ".pch, toolchains.json, inline, which that build uses; run the command again when "
                                  "it is done")
    assert (cache / "_shared.lib").is_dir() and _names(cache / "_shared.lib") != [".lock"]
    assert (cache / ".pch").is_dir() and (cache / "inline").is_dir()
    res = _cli("cache", "clean", OPBUILDER_CACHE_DIR=str(cache))
    assert res.returncode == 0, res.stderr
    assert _names(cache / "_shared.lib") == [".lock"] and not (cache / ".pch").exists()
    assert not (cache / "inline").exists()


@pytest.mark.build  # the CLI child compiles (tests/build_guard.py)
def test_clean_keeps_every_shared_library_while_one_of_them_is_built(tmp_path, cache):
    """The locks were looked at as the operators were removed: "_a" went before "_b" was found busy (as
    nanobind's runtime went while the core library was being built)."""
    from opbuilder.cache.lock import build_lock

    src = tmp_path / "lib.cpp"
    src.write_text('extern "C" int one() { return 1; }\n')
    for name in ("_a", "_b"):
        assert _cli("build", name, str(src), "--library", OPBUILDER_CACHE_DIR=str(cache)).returncode == 0
    with build_lock(cache / "_b.lib", "_b"):
        res = _cli("cache", "clean", OPBUILDER_CACHE_DIR=str(cache))
    assert res.returncode == 1 and "kept _a, _b, .pch" in res.stderr, res.stderr
    assert _names(cache / "_a.lib") != [".lock"] and _names(cache / "_b.lib") != [".lock"]


@pytest.mark.build  # the CLI child compiles (tests/build_guard.py)
def test_clean_keeps_the_lock_file_that_waiting_builds_have_open(tmp_path, cache):
    # a build waiting for the lock has .lock open: removing it would let a later build lock a new
    # file while the waiting one, once it holds the old one, builds in the same directory
    src = tmp_path / "kept.cpp"
    src.write_text('extern "C" int kept() { return 8; }\n')
    assert _cli("build", "kept", str(src), "--library", OPBUILDER_CACHE_DIR=str(cache)).returncode == 0
    lock = cache / "kept.lib" / ".lock"
    with open(lock) as waiting_build:
        res = _cli("cache", "clean", "kept", OPBUILDER_CACHE_DIR=str(cache))
        assert res.returncode == 0 and f"removed {cache / 'kept.lib'}" in res.stdout
        assert _names(cache / "kept.lib") == [".lock"]
        assert os.fstat(waiting_build.fileno()).st_nlink == 1
        assert os.fstat(waiting_build.fileno()).st_ino == lock.stat().st_ino  # still the file everyone locks
    gone = _cli("cache", "list", "kept", OPBUILDER_CACHE_DIR=str(cache))
    assert gone.returncode == 1 and "nothing cached for operator 'kept'" in gone.stderr
    res = _cli("build", "kept", str(src), "--library", OPBUILDER_CACHE_DIR=str(cache))
    assert res.returncode == 0 and ctypes.CDLL(res.stdout.strip()).kept() == 8


@pytest.mark.build  # the doctor child runs the compilers' checks (tests/build_guard.py)
def test_doctor_explains_broken_ninja_and_pybind11_installs(tmp_path, cache):
    # packages that import but lack what a build needs, found before the real ones, as after
    # an interrupted or partial install
    broken = tmp_path / "broken"
    (broken / "ninja").mkdir(parents=True)
    (broken / "ninja" / "__init__.py").write_text(f"BIN_DIR = {str(tmp_path / 'no-bin')!r}\n")
    (broken / "pybind11").mkdir()
    (broken / "pybind11" / "__init__.py").write_text(
        f"__version__ = '2.13.6'\ndef get_include():\n    return {str(tmp_path / 'no-include')!r}\n")
    res = _cli("doctor", OPBUILDER_CACHE_DIR=str(cache), PYTHONPATH=str(broken))
    assert res.returncode == 1
    lines = res.stdout.splitlines()

    assert _fix_after(lines, f"error pybind11: no headers under {tmp_path / 'no-include'}") == \
        "fix: python -m pip install --force-reinstall pybind11"
    assert _fix_after(lines, f"error ninja: the ninja package has no binary at {tmp_path / 'no-bin' / 'ninja'}") == \
        "fix: python -m pip install --force-reinstall ninja"
    assert lines[-1] == "2 problem(s) found"
