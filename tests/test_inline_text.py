"""load_inline's text without its slow imports (opbuilder/inline.py): C++ string literals written as
json.dumps writes them, the binding read as compile/binding.py reads it, directory keys that differ."""
from __future__ import annotations

import json

import pytest

from opbuilder import inline
from opbuilder.compile.binding import NANOBIND, binding_of_text


@pytest.mark.parametrize("text", ["", "add one", 'a "quoted" \\ path', "tab\tnew\nline\r\x01\x7f\b\f",
                                  "caf\u00e9 \u20ac \u2028"])
def test_a_docstring_literal_within_the_bmp_is_what_json_dumps_writes(text):
    assert inline._literal(text) == json.dumps(text)


@pytest.mark.parametrize("text", ["smile \U0001f642", "caf\u00e9 \U0001f600\u2028 \"q\"\n"])
def test_a_character_beyond_the_bmp_is_one_universal_character_name(text):
    """JSON writes U+1F642 as a surrogate pair (\\ud83d\\ude42), which is no character in C++: g++
    refused the build ("\\ud83d is not a valid universal character")."""
    lit = inline._literal(text)
    assert lit.isascii() and "\\ud83d" not in lit and "\\U0001f6" in lit
    assert lit[1:-1].encode("ascii").decode("unicode_escape") == text


@pytest.mark.parametrize("doc, shown", [("a\x00b", "'\\x00'"), ("a\ud83db", "'\\ud83d'")])
def test_a_docstring_a_c_string_cannot_carry_is_refused(doc, shown):
    with pytest.raises(ValueError, match=r"^load_inline\('op'\): the docstring for 'f' holds " + shown.replace("\\", "\\\\")
                       + r", which a C\+\+ docstring cannot carry; remove it$"):
        inline._functions("op", {"f": doc})


@pytest.mark.parametrize("cpp", ["int f();", "OB_MODULE(m) { }", "NB_MODULE(x, m) {}",
                                 "PYBIND11_MODULE(OB_EXTENSION_NAME, m) {}", "#include <nanobind/nanobind.h>", "#include <pybind11/pybind11.h>",
                                 '#include "ms_extension.h"', "OB_MOD\\\nULE(m) {}", "OB_MOD\\  \nULE(m) {}",
                                 "// OB_MODULE(m)\nint g();", "#if 0\nPYBIND11_MODULE(x, m) {}\n#endif\n",
                                 "const char *s = \"a\\\\\";\nint h();"])
def test_the_binding_is_read_as_the_scanner_reads_it(cpp):
    assert inline._binding_of(cpp) == binding_of_text(cpp)


def test_the_binding_name_is_the_scanners():
    assert inline.NANOBIND == NANOBIND


def test_keys_differ_where_the_parts_differ():
    # each part is written with its length: moving text from one part to the next is another key
    assert inline._key("op", "ab", "", {}) != inline._key("op", "a", "b", {})
    assert inline._key("op", "x", "", {"f": ""}) != inline._key("op", "x", "", {"f": "", "": ""})
    assert inline._key("op", "x", "", {}) == inline._key("op", "x", "", {})


@pytest.mark.build  # compiles one inline function (tests/build_guard.py)
def test_an_emoji_in_a_docstring_builds_and_reads_back(cache_dir):
    import opbuilder
    doc = "smile \U0001f642, caf\u00e9"
    m = opbuilder.load_inline("inline_doc_emoji", "int a() { return 1; }\n", functions={"a": doc})
    assert m.a() == 1 and m.a.__doc__.endswith(doc)


@pytest.mark.parametrize("who", ["Inline", "load_inline"])
def test_a_keyword_customopbuilder_does_not_take_is_refused_before_anything_is_written(who, tmp_path, monkeypatch):
    # Inline took torch's extra_cflags silently: load_many failed the item later, naming CustomOpBuilder
    monkeypatch.setenv("OPBUILDER_CACHE_DIR", str(tmp_path / "cache"))
    make = getattr(inline, who)
    with pytest.raises(TypeError) as e:
        make("kw", "double f(double x) { return x; }", functions=["f"], extra_cflags=["-O2"], verbos=True)
    assert str(e.value) == (f"{who} got unexpected keyword argument(s) extra_cflags, verbos; accepted: name, "
                            "cpp_sources, functions, cuda_sources, and CustomOpBuilder's backend, include_paths, "
                            "cflags, ldflags, cuda_cflags, cuda_arch, build_dir, debug_mode, verbose, binding")
    assert not (tmp_path / "cache").exists()
