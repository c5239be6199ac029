"""Which binding a source uses is read as the preprocessor reads it (binding.py): lines joined at a
backslash-newline, comments dropped, and the regions it certainly skips (``#if 0`` blocks, the
``#else`` of an ``#if 1``) not read as code. A condition that is not a constant may go either way."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from op_util import load_op
from opbuilder import BuildError
from opbuilder.compile import binding
from opbuilder.compile.binding import NANOBIND, PYBIND11, RECORD, detect_binding
from opbuilder.cache.fingerprint import file_digest

PB = "PYBIND11_MODULE(OB_EXTENSION_NAME, m) {}"
NB = "OB_MODULE(m) {}"


def _src(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize("text,expected", [
    (f"#if 0\n{PB}\n#endif\n{NB}", NANOBIND),                                   # a disabled block
    (f"#if 0\n#include <pybind11/numpy.h>\n#endif\n{NB}", NANOBIND),            # a disabled include
    (f"#if 1\n{NB}\n#else\n{PB}\n#endif", NANOBIND),                           # the branch not taken
    (f"#  if (0)\n{NB}\n#elif 1\n{PB}\n#else\n{NB}\n#endif", PYBIND11),        # #elif: the one taken
    (f"#if 0\n#ifdef X\n{PB}\n#else\n{PB}\n#endif\n#endif\n{NB}", NANOBIND),    # nested in a disabled block
    (f"#if !1\n{PB}\n#endif\n#if false\n{PB}\n#endif\n{NB}", NANOBIND),
    (f"// was: \\\n{PB}\n{NB}", NANOBIND),                                     # a comment continued
    (f"// was: \\  \n{PB}\n{NB}", NANOBIND),                                   # blanks after the backslash
    (f"#if 1\n#elif X\n{PB}\n#endif\n{NB}", NANOBIND),                          # after a branch certainly taken
    (f"#define X 0\n#if X\n{PB}\n#endif", PYBIND11),                            # not a constant: may be taken
    ("OB_MOD\\\nULE(m) {}", NANOBIND),                                          # a name split across lines
])
def test_the_binding_is_read_as_the_preprocessor_reads_the_source(tmp_path, text, expected):
    assert detect_binding("op", [_src(tmp_path / "op.cpp", text)]) == expected


@pytest.mark.parametrize("text", [
    f"#ifdef USE_NANOBIND\n{NB}\n#else\n{PB}\n#endif",
    f"#if 0\n#elif defined(X)\n{NB}\n#else\n{PB}\n#endif",
])
def test_a_module_chosen_by_a_macro_is_an_error_that_says_how_to_choose(tmp_path, text):
    with pytest.raises(BuildError, match=re.escape(
            "operator 'op' mixes binding libraries: op.cpp use(s) nanobind (OB_MODULE, NB_MODULE or "
            "<nanobind/...>) and op.cpp use(s) pybind11 (PYBIND11_MODULE, <pybind11/...> or ms_extension.h); "
            "one module is bound with one of them: write it with OB_MODULE(m) (nanobind) or "
            "PYBIND11_MODULE(OB_EXTENSION_NAME, m); sources that choose between the two with a macro (#ifdef) "
            "say which with binding='nanobind' or binding='pybind11'")):
        detect_binding("op", [_src(tmp_path / "op.cpp", text)])


def test_a_record_written_by_the_earlier_scan_is_not_trusted(tmp_path, monkeypatch):
    src = _src(tmp_path / "op.cpp", f"#if 0\n{PB}\n#endif\n{NB}")
    record = _src(tmp_path / RECORD, json.dumps({file_digest(src): "1100"}))  # the old scan's answer
    monkeypatch.setattr(binding, "_memo", {})
    assert detect_binding("op", [src], record) == NANOBIND
    assert json.loads(record.read_text()) == {file_digest(src): "1000" + binding.SCAN}


@pytest.mark.build
def test_an_operator_with_a_disabled_pybind11_module_builds_with_nanobind(tmp_path_factory, cache_dir):
    src = _src(tmp_path_factory.mktemp("scan") / "scan_ops.cpp", (
        '#include "opbuilder/extension.h"\n'
        "#if 0  // the pybind11 form, kept for reference\n"
        "PYBIND11_MODULE(OB_EXTENSION_NAME, m) { m.def(\"value\", [] { return 1; }); }\n"
        "#endif\n"
        "// the old form, continued: \\\n"
        "#include <pybind11/numpy.h>\n"
        'OB_MODULE(m) { m.def("value", [] { return 2; }); }\n'))
    ops = load_op("scan_ops", [src])
    assert ops.value() == 2
    assert type(ops.value).__name__ == "nb_func"
