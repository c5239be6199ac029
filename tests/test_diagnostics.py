"""BuildError.diagnostics: the compiler's errors and warnings as opbuilder.Diagnostic records, at the
user's file and line (or the line inside the user's string for load_inline), never in generated code."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import opbuilder
from opbuilder import BuildError, CustomOpBuilder, Diagnostic
from opbuilder.compile.diagnostics import from_build_log, parse_json, parse_ptxas, parse_text

CHECKS = Path(__file__).resolve().parent / "cpp" / "function_checks_ops.cpp"


def _quoted(name: str, rest: str) -> tuple:
    """The message as gcc writes it in a UTF-8 locale and in the C locale (other quotes)."""
    return (f"‘{name}’{rest}", f"'{name}'{rest}")


def _error(build) -> BuildError:
    with pytest.raises(BuildError) as info:
        build()
    return info.value


@pytest.fixture(scope="session")
def file_error(tmp_path_factory):
    src = tmp_path_factory.mktemp("diag") / "diag_file.cpp"
    src.write_text('#include "opbuilder/extension.h"\n'
                   "int value(int x) {\n"
                   "  int unused = 1;\n"
                   "  return x + zq_undeclared;\n"
                   "}\n"
                   'OB_MODULE(m) { m.def("value", &value); }\n')
    return src, _error(lambda: CustomOpBuilder("diag_file", [str(src)], cflags=["-Wall"]).load())


@pytest.mark.build
def test_a_file_sources_errors_and_warnings_are_at_its_lines(file_error):
    src, err = file_error
    assert [d._replace(message="") for d in err.diagnostics] == [
        Diagnostic(str(src), 4, 14, "error", ""), Diagnostic(str(src), 3, 7, "warning", "")]
    assert err.diagnostics[0].message in _quoted("zq_undeclared", " was not declared in this scope")
    assert err.diagnostics[1].message in ("unused variable ‘unused’", "unused variable 'unused'")


@pytest.mark.build
def test_the_message_keeps_the_compilers_text(file_error):
    src, err = file_error
    lines = str(err).splitlines()
    assert lines[0] == "building operator 'diag_file' failed:"
    assert lines[1].startswith(f"{src}:4:14: error: ")
    assert lines[2:4] == ["    4 |   return x + zq_undeclared;", "      |              ^~~~~~~~~~~~~"]


@pytest.mark.build
def test_an_inline_strings_error_is_at_its_line_in_the_string(cache_dir):
    cpp = "int helper() { return 1; }\n\nint value() {\n  return helper() + zq_undefined_thing;\n}\n"
    err = _error(lambda: opbuilder.load_inline("diag_inline", cpp, functions=["value"]))
    [d] = err.diagnostics
    assert Path(d.file).name == "cpp_sources.cpp" and Path(d.file).read_text() == cpp  # the string, verbatim
    assert Path(d.file).parent.parent == Path(cache_dir).resolve() / "inline" / "diag_inline"
    assert (d.line, d.column, d.severity) == (4, 21, "error")
    assert d.message in _quoted("zq_undefined_thing", " was not declared in this scope")


@pytest.mark.build
def test_an_error_in_the_generated_binding_names_the_string_with_no_line(cache_dir):
    err = _error(lambda: opbuilder.load_inline("diag_binding", "int value() { return 1; }\n", functions=["nothere"]))
    [d] = err.diagnostics
    assert Path(d.file).name == "cpp_sources.cpp" and (d.line, d.column, d.severity) == (None, None, "error")
    assert d.message in _quoted("nothere", " was not declared in this scope")


@pytest.mark.build
def test_an_inline_string_that_leaves_a_block_open_says_so_first(cache_dir):
    """Before, every diagnostic was about the generated OB_MODULE ("cannot declare static function inside
    another function"), none at the user's code; now the first says the string leaves a '{' open. (A string
    with its own OB_MODULE gets the compiler's errors at that line of its own.)"""
    said = ("cpp_sources ends inside a block: a '{' it opens is not closed, so what follows it is inside that block")
    for name, cpp in (("diag_open", "double f(double x) {\n  return x;\n"),
                      ("diag_open_ns", "namespace a {\ndouble f(double x) { return x; }\n")):  # a namespace: at the end
        err = _error(lambda: opbuilder.load_inline(name, cpp, functions=["f"]))
        assert str(err).splitlines()[0] == f"building operator '{name}' failed: {said}"
        d = err.diagnostics[0]
        assert Path(d.file).name == "cpp_sources.cpp" and (d.line, d.column, d.severity, d.message) == (
            None, None, "error", said)


@pytest.mark.build
def test_a_static_assert_in_opbuilders_headers_is_at_the_users_line_that_required_it():
    err = _error(lambda: CustomOpBuilder("diag_noforward", [str(CHECKS)], cflags=["-DCHECK=NoForward"]).build())
    line = next(i for i, text in enumerate(CHECKS.read_text().splitlines(), 1) if "CHECK::Apply(x)" in text)
    [d] = err.diagnostics
    assert (d.file, d.line, d.severity) == (str(CHECKS), line, "error")
    assert d.column == CHECKS.read_text().splitlines()[line - 1].index("CHECK::Apply(x)") + len("CHECK::Apply(")
    assert d.message == ("static assertion failed: Function<T>: T has no Forward. Declare it in T (T is named in the "
                         "'In instantiation of FunctionChecks<T, ...>' line): static TensorPtr Forward(AutogradContext "
                         "*ctx, <the arguments given to Apply>) (or returning TensorPtrList)")


@pytest.mark.build
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH: the CUDA compile needs it")
def test_an_nvcc_front_end_error_is_at_its_line_in_the_cuda_string(cache_dir):
    cuda = "__global__ void k(float *x) {\n    x[0] = zq_cuda + 1;\n}\n"
    err = _error(lambda: opbuilder.load_inline("diag_cuda", "", cuda_sources=cuda, cuda_arch="8.0"))
    [d] = err.diagnostics
    assert Path(d.file).name == "cuda_sources.cu" and Path(d.file).read_text() == cuda
    assert (d.line, d.column, d.severity, d.message) == (2, 12, "error", 'identifier "zq_cuda" is undefined')


@pytest.mark.build
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH: the CUDA compile needs it")
def test_an_nvcc_assembler_error_is_at_the_cuda_string_with_no_line(cache_dir):
    """Past nvcc's front end, ptxas refuses a kernel (here: more shared memory than any GPU has) and names
    no file or line: the record is at the user's CUDA string, with no line, never empty."""
    cuda = "__global__ void big(float *o) {\n  __shared__ float s[100000];\n  s[threadIdx.x] = 1;\n  o[0] = s[1];\n}\n"
    err = _error(lambda: opbuilder.load_inline("diag_ptxas", "", cuda_sources=cuda, cuda_arch="8.0"))
    [d] = err.diagnostics
    assert Path(d.file).name == "cuda_sources.cu" and Path(d.file).read_text() == cuda
    assert (d.line, d.column, d.severity) == (None, None, "error")
    assert d.message == "Entry function '_Z3bigPf' uses too much shared data (0x61a80 bytes, 0xc000 max)"
    assert d.message in str(err)


# ---- the parsers, on compiler output as it is printed (nothing compiles) --------------------------

def test_nvcc_front_end_lines_are_parsed(tmp_path):
    text = ('k.cu(2): error: identifier "zq" is undefined\n    x[0] = zq;\n           ^\n\n'
            'k.cu(5): warning #177-D: variable "v" was declared but never referenced\n'
            "1 error detected in the compilation of \"k.cu\".\n")
    assert parse_text(text, "/b") == [Diagnostic("/b/k.cu", 2, None, "error", 'identifier "zq" is undefined'),
                                      Diagnostic("/b/k.cu", 5, None, "warning",
                                                 'variable "v" was declared but never referenced')]
    (tmp_path / "k.cu").write_text("__global__ void k(float *x) {\n  x[0] = zq;\n}\n")
    # with the file there, the caret's column (nvcc echoes the line indented by two spaces)
    assert parse_text(text, str(tmp_path))[0].column == 10


def test_ptxas_lines_are_at_the_compiled_source_with_no_line():
    text = ("ptxas error   : Entry function '_Z1kPf' uses too much shared data (0x61a80 bytes, 0xc000 max)\n"
            "ptxas fatal   : Unresolved extern function '_Z4helpv'\n")
    assert parse_ptxas(text, "/u/k.cu") == [
        Diagnostic("/u/k.cu", None, None, "error", "Entry function '_Z1kPf' uses too much shared data (0x61a80 bytes, "
                                                   "0xc000 max)"),
        Diagnostic("/u/k.cu", None, None, "fatal error", "Unresolved extern function '_Z4helpv'")]
    log = ("[1/2] compiling k.cu (nvcc)\nFAILED: obj/k.o\n/usr/local/bin/nvcc -MD -MF obj/k.o.d -c /u/k.cu -o obj/k.o\n"
           + text.splitlines()[0] + "\nninja: build stopped: subcommand failed.\n")
    assert from_build_log(log, "/b", lambda p: True) == parse_ptxas(text, "/u/k.cu")[:1]


def test_a_header_error_moves_to_the_users_include_line():
    text = ("In file included from /u/op.cpp:3:\n/lib/h.h:7:2: error: boom\n    7 | boom\n")
    assert parse_text(text, "/b", lambda p: p.startswith("/u/")) == [Diagnostic("/u/op.cpp", 3, None, "error", "boom")]


def test_gccs_json_arrays_one_per_translation_unit_are_parsed():
    one = ('[{"kind": "error", "locations": [{"caret": {"file": "a.cpp", "line": 3, "column": 14}}], '
           '"message": "x"}, {"kind": "note", "locations": [{"caret": {"file": "a.cpp", "line": 1, "column": 1}}],'
           ' "message": "n"}]')
    two = ('[{"kind": "warning", "locations": [{"caret": {"file": "/s/b.cpp", "line": 9, "column": 2}}], '
           '"message": "w"}]')
    assert parse_json(one + two, "/b") == [Diagnostic("/b/a.cpp", 3, 14, "error", "x"),
                                           Diagnostic("/s/b.cpp", 9, 2, "warning", "w")]
    assert parse_json("a.cpp:1:1: error: x", "/b") is None


def test_diagnostics_are_worked_out_once_when_first_read():
    found = Diagnostic("/u/a.cpp", 1, 2, "error", "x")
    calls = []
    err = BuildError("building operator 'x' failed", name="x", diagnostics=lambda: calls.append(1) or [found])
    assert calls == []  # a failed build whose records nobody reads runs no compiler again
    assert err.diagnostics == [found] and err.diagnostics == [found] and calls == [1]
    assert BuildError("m", name="x").diagnostics == []
