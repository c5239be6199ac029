"""Errors that name their cause: a compiler that is not one, a cache directory that cannot be made,
a module name that is not the operator's, a Function<T> without Forward/Backward, compiler warnings."""
import os
import re
import shutil
from pathlib import Path

import pytest

from opbuilder import BuildError, CustomOpBuilder, ToolchainError, build_library

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)


@pytest.fixture
def plain(tmp_path):
    src = tmp_path / "plain.cpp"
    src.write_text('extern "C" int plain() { return 1; }\n')
    return src


# ---- the compiler -------------------------------------------------------------------------------

@pytest.mark.parametrize("cxx", ["/bin/false", "false"])
def test_a_compiler_that_does_not_answer_version_is_named_with_its_variable(tmp_path, plain, monkeypatch, cxx):
    monkeypatch.setenv("CXX", cxx)
    with pytest.raises(ToolchainError) as info:
        build_library("falsecxx", [plain], build_dir=tmp_path / "cache")
    assert re.match(rf"CXX={cxx!r} is not a working compiler: '\S*false --version' exited with status 1"
                    rf"(; its first line: '.*'|, printing nothing)\. Set it to a C\+\+ compiler \(g\+\+, clang\+\+\)$",
                    str(info.value)), str(info.value)
    err = info.value
    assert isinstance(err, BuildError) and isinstance(err, FileNotFoundError) and err.name == "falsecxx"


@pytest.mark.parametrize("cxx, fix", [("gcc", "g++"), ("cc", "c++")])
def test_a_c_driver_as_cxx_is_named_before_it_publishes_a_library_that_cannot_load(tmp_path, plain, monkeypatch,
                                                                                   cxx, fix):
    # CXX=gcc compiled, linked without libstdc++ and published a nanobind runtime whose every load() was a
    # raw OSError (undefined symbol _ZTVN10__cxxabiv120__si_class_type_infoE): an attack's find; fails on
    # 093ecc5)
    if shutil.which(cxx) is None:
        pytest.skip(f"no {cxx} on PATH")
    monkeypatch.setenv("CXX", cxx)
    with pytest.raises(ToolchainError) as info:
        build_library("cdriver", [plain], build_dir=tmp_path / "cache")
    assert str(info.value) == (f"CXX={cxx!r} is a C compiler driver: it compiles C++ but links without the C++ runtime "
                               f"(libstdc++), so what it builds cannot be imported; set CXX to its C++ driver ({fix})")
    assert not (tmp_path / "cache" / "cdriver.lib").exists() or not any((tmp_path / "cache" / "cdriver.lib").glob("*/*.so"))


def test_gcc_as_nvccs_host_compiler_is_still_taken(tmp_path, monkeypatch):
    # nvcc's host compiler compiles host code only: CUDAHOSTCXX=gcc works, and b7d4c0d refused it
    from opbuilder.tools import toolchain
    if shutil.which("gcc") is None:
        pytest.skip("no gcc on PATH")
    monkeypatch.setenv("CUDAHOSTCXX", "gcc")
    nvcc = toolchain.Compiler(("nvcc",), "/nowhere/nvcc", "nvcc", "nvcc", "nvcc")
    flags, identity = toolchain.nvcc_host(nvcc, [], tmp_path)
    assert flags == ("-ccbin", shutil.which("gcc")) and "gcc" in identity


def test_a_compiler_that_writes_nothing_is_named(tmp_path, plain, monkeypatch):
    script = tmp_path / "silent-cxx.sh"  # answers --version as a compiler does, then compiles nothing
    script.write_text("#!/bin/sh\n[ \"$1\" = --version ] && echo 'silent 1.0' \nexit 0\n")
    script.chmod(0o755)
    monkeypatch.setenv("CXX", str(script))
    with pytest.raises(BuildError, match=rf"^building operator 'silent' failed: CXX='{re.escape(str(script))}' "
                                         rf"\(\S+silent-cxx.sh\) exited successfully compiling plain.cpp but wrote "
                                         rf"no obj/plain-\w+\.o: it does not work as a C\+\+ compiler \(-c, -o, -MD "
                                         rf"-MF as g\+\+ and clang\+\+ take them\); set CXX to one$"):
        build_library("silent", [plain], build_dir=tmp_path / "cache")


# ---- the cache directory ------------------------------------------------------------------------

def test_a_cache_dir_that_cannot_be_created_names_the_variable_and_its_value(plain, monkeypatch):
    monkeypatch.setenv("OPBUILDER_CACHE_DIR", "/proc/self/x")
    with pytest.raises(BuildError, match=r"^building operator 'nocache' failed: cannot create the opbuilder cache "
                                         r"directory /proc/self/x \(No such file or directory: /proc/\d+/x\); set "
                                         r"OPBUILDER_CACHE_DIR to a directory you can create and write to \(the "
                                         r"cache directory is OPBUILDER_CACHE_DIR='/proc/self/x'\)$"):
        build_library("nocache", [plain])
    with pytest.raises(BuildError, match=r"^building operator 'nocache' failed: .* \(the cache directory is "
                                         r"build_dir='/proc/self/y'\)$"):
        CustomOpBuilder("nocache", [plain], build_dir="/proc/self/y").build()


def test_a_cache_dir_below_a_file_says_so(tmp_path, plain, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("OPBUILDER_CACHE_DIR", str(blocker / "cache"))
    with pytest.raises(BuildError, match=rf"^building operator 'filecache' failed: cannot create "
                                         rf"{re.escape(str(blocker))}/cache \(Not a directory: a part of that path is "
                                         rf"a file\); set OPBUILDER_CACHE_DIR to a directory you can write to \(the "
                                         rf"cache directory is OPBUILDER_CACHE_DIR='{re.escape(str(blocker))}/cache'\)$"):
        build_library("filecache", [plain])


# ---- the module name ----------------------------------------------------------------------------

_FIX = (r"declare the module with OB_MODULE\(m\) \(nanobind\), or PYBIND11_MODULE\(OB_EXTENSION_NAME, m\) "
        r"\(MS_EXTENSION_NAME also works\): opbuilder names it '{name}', the operator's name\nlibrary: \S+\.so$")


def test_a_module_declared_under_another_name_says_to_use_the_macro(tmp_path):
    src = tmp_path / "named.cpp"  # what PYBIND11_MODULE(other_name, m) defines, on the bare C API (cheap)
    src.write_text('#include <Python.h>\nstatic PyModuleDef def = {PyModuleDef_HEAD_INIT, "x", nullptr, -1, nullptr};\n'
                   'PyMODINIT_FUNC PyInit_other_name(void) { return PyModule_Create(&def); }\n')
    with pytest.raises(BuildError, match=r"^operator 'named_op' was built but cannot be imported: the library "
                                         r"declares the Python module 'other_name', not 'named_op' \(PyInit_named_op "
                                         r"is missing\); " + _FIX.format(name="named_op")):
        CustomOpBuilder("named_op", [src]).load()


def test_pybind11_module_under_another_name_says_to_use_the_macro(tmp_path):
    src = tmp_path / "pyb_named.cpp"
    src.write_text("#include <pybind11/pybind11.h>\nPYBIND11_MODULE(wrong_name, m) { m.def(\"one\", [] { return 1; }); }\n")
    with pytest.raises(BuildError, match=r"^operator 'pyb_named' was built but cannot be imported: the library "
                                         r"declares the Python module 'wrong_name', not 'pyb_named' \(PyInit_pyb_named "
                                         r"is missing\); " + _FIX.format(name="pyb_named")):
        CustomOpBuilder("pyb_named", [src]).load()


def test_a_module_without_any_module_says_to_declare_one(tmp_path):
    src = tmp_path / "nomodule.cpp"
    src.write_text("int no_module_here() { return 1; }\n")
    with pytest.raises(BuildError, match=r"^operator 'nomodule_op' was built but cannot be imported: the library "
                                         r"defines no Python module \(no PyInit_ function\); "
                                         + _FIX.format(name="nomodule_op")):
        CustomOpBuilder("nomodule_op", [src]).load()


# ---- compiler warnings --------------------------------------------------------------------------

WARNED = '#warning "check this"\nextern "C" int warned() { return 1; }\n#warning "and this"\n'


def test_warnings_in_the_users_source_are_summed_up_on_stderr(tmp_path, capsys):
    src = tmp_path / "warned.cpp"
    src.write_text(WARNED)
    build_library("warned", [src], build_dir=tmp_path / "cache")
    err = capsys.readouterr().err
    assert "opbuilder: warned: 2 compiler warnings in warned.cpp (verbose=True shows them)\n" in err, err
    assert "check this" not in err
    build_library("warned", [src], build_dir=tmp_path / "cache")  # warm: nothing compiled, nothing said
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_verbose_shows_the_warnings_themselves(tmp_path, capsys, monkeypatch, how):
    src = tmp_path / "warned.cpp"
    src.write_text(WARNED)
    if how == "environment":
        monkeypatch.setenv("OPBUILDER_VERBOSE", "1")
    build_library("warned_v", [src], build_dir=tmp_path / "cache", verbose=how == "argument")
    err = capsys.readouterr().err
    head = "opbuilder: warned_v: 2 compiler warnings in warned.cpp:\n"
    assert head in err, err
    shown = err.split(head, 1)[1].splitlines()
    assert shown[0].startswith(f"{src}:1:") and 'warning: #warning "check this"' in shown[0]
    assert any(line.startswith(f"{src}:3:") and 'warning: #warning "and this"' in line for line in shown)


def test_only_warnings_about_the_users_files_count(tmp_path):
    """Real compiler output: a warning in a header of a directory that is not the user's is left out,
    the context before a warning (In function ...) and the excerpt after it are kept."""
    import subprocess

    from builder_util import REAL_CXX
    from opbuilder.compile.compiler_warnings import user_warnings

    theirs, mine = tmp_path / "third_party", tmp_path / "project"
    theirs.mkdir()
    mine.mkdir()
    (theirs / "lib.h").write_text('#warning "from a library"\n')
    (mine / "own.h").write_text('#warning "from my header"\n')
    (mine / "op.cpp").write_text('#include "lib.h"\n#include "own.h"\nint f() {\n  int unused = 1;\n  return 0;\n}\n')
    out = subprocess.run([REAL_CXX, "-Wall", f"-I{theirs}", f"-I{mine}", "-c", "op.cpp", "-o", "op.o"],
                         cwd=mine, capture_output=True, text=True).stderr
    assert "from a library" in out  # the compiler did warn about it
    found = user_warnings(out, str(mine), [str(theirs)])
    assert [Path(f).name for f, _ in found] == ["own.h", "op.cpp"], out
    text = found[1][1].splitlines()
    assert "In function" in text[0] and "unused variable" in text[1] and "int unused = 1;" in text[2], out
    assert all("from a library" not in t for _, t in found)


def test_a_missing_return_is_an_error_by_default(tmp_path):
    src = tmp_path / "noreturn.cpp"
    src.write_text("int pick(int x) {\n  if (x > 0) return 1;\n}\n")
    with pytest.raises(BuildError) as info:
        build_library("noreturn", [src], build_dir=tmp_path / "cache")
    lines = str(info.value).splitlines()
    assert lines[0] == "building operator 'noreturn' failed:"
    assert re.match(rf"{re.escape(str(src))}:3:1: error: .* \[-Werror(=|,-W)return-type\]$", lines[1]), lines
    # the user's own flags come after it: they may turn it back into a warning
    build_library("noreturn", [src], build_dir=tmp_path / "cache", cflags=["-Wno-error=return-type"])


# ---- Function<T> without Forward/Backward or with a wrong signature ------------------------------

FUNCTION_CHECKS = Path(__file__).resolve().parent / "cpp" / "function_checks_ops.cpp"


@pytest.mark.parametrize("cls, why", [
    ("NoForward", r"T has no Forward\. Declare it in T"),
    ("NoBackward", r"T has no Backward\. Declare it in T"),
    ("MemberForward", r"T::Forward cannot be called as T::Forward\(AutogradContext \*ctx, <the arguments given to "
                      r"Apply>\): it must be static"),
    ("NoContext", r"T::Forward cannot be called as T::Forward\(AutogradContext \*ctx"),
    ("IntForward", r"T::Forward must return TensorPtr or TensorPtrList"),
    ("OneGradBackward", r"T::Backward cannot be called as T::Backward\(AutogradContext \*ctx, TensorPtrList "
                        r"grad_outputs\)"),
    ("TensorBackward", r"T::Backward must return TensorPtrList"),
])
def test_a_function_without_forward_or_backward_is_one_static_assert_naming_the_class(cls, why):
    name = f"checks_{cls.lower()}"
    with pytest.raises(BuildError) as info:
        CustomOpBuilder(name, [FUNCTION_CHECKS], cflags=[f"-DCHECK={cls}"]).build()
    lines = str(info.value).splitlines()
    assert lines[0] == f"building operator '{name}' failed:"
    assert re.match(r"\S+/opbuilder/detail/function_checks\.h:\d+:\d+: error: static assert(ion)? failed: "
                    r"Function<T>: " + why, lines[1]), lines
    assert re.match(rf"  in Function<{cls}>, required from {re.escape(str(FUNCTION_CHECKS))}:\d+", lines[2]), lines
    assert sum(": error:" in line for line in lines) == 1, lines  # the assertion is the only error


def test_a_function_with_a_template_and_an_overloaded_forward_passes_the_checks():
    mod = CustomOpBuilder("checks_template", [FUNCTION_CHECKS], cflags=["-DCHECK=TemplateForward"]).load()
    import runtime as rt

    assert mod.f(rt.Tensor([1.0, 2.0])).tolist() == [1.0, 2.0]
