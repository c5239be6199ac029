"""Progress: one status line per step on stderr while compiling, nothing when warm;
verbose shows the commands; everything also goes to logging.getLogger("opbuilder")."""
import logging

from opbuilder import build_library
import pytest

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)


def _source(tmp_path, name, value):
    src = tmp_path / f"{name}.cpp"
    src.write_text(f'extern "C" int {name}() {{ return {value}; }}\n')
    return str(src)


def test_status_lines_while_compiling_and_silence_when_warm(tmp_path, capfd):
    src = _source(tmp_path, "progress_op", 1)
    build_library("progress_op", [src], build_dir=tmp_path / "cache")
    lines = capfd.readouterr().err.splitlines()
    assert lines[0] == "opbuilder: building progress_op [1/2] compiling progress_op.cpp"
    assert lines[1] == "opbuilder: building progress_op [2/2] linking libprogress_op.so"
    assert lines[2].startswith("opbuilder: built progress_op in ") and len(lines) == 3
    build_library("progress_op", [src], build_dir=tmp_path / "cache")
    assert capfd.readouterr() == ("", "")  # the warm path says nothing


def test_verbose_shows_the_commands(tmp_path, capfd, monkeypatch):
    from opbuilder.tools.toolchain import find_compiler

    cxx = find_compiler(None).argv[0]
    build_library("verbose_op", [_source(tmp_path, "verbose_op", 2)], build_dir=tmp_path / "c1", verbose=True)
    err = capfd.readouterr().err
    assert any(line.startswith(cxx) and " -c " in line and "verbose_op.cpp" in line for line in err.splitlines())

    monkeypatch.setenv("OPBUILDER_VERBOSE", "1")
    build_library("verbose_op", [_source(tmp_path, "verbose_op", 3)], build_dir=tmp_path / "c2")
    err = capfd.readouterr().err
    assert any(line.startswith(cxx) and "-shared" in line for line in err.splitlines())


def test_quiet_by_default_shows_no_commands(tmp_path, capfd, monkeypatch):
    monkeypatch.delenv("OPBUILDER_VERBOSE", raising=False)
    build_library("quiet_op", [_source(tmp_path, "quiet_op", 4)], build_dir=tmp_path / "cache")
    assert " -c " not in capfd.readouterr().err


def test_builds_are_logged_to_the_opbuilder_logger(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="opbuilder"):
        build_library("logged_op", [_source(tmp_path, "logged_op", 5)], build_dir=tmp_path / "cache")
    messages = [r.getMessage() for r in caplog.records if r.name == "opbuilder"]
    assert any(m.startswith("building logged_op in ") for m in messages)
    assert any(m.startswith("built logged_op in ") for m in messages)
