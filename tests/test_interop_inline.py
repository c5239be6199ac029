"""opbuilder.load_inline: operator modules from source strings, cached by content."""
from __future__ import annotations

import re

import numpy as np
import pytest

import opbuilder
import runtime as rt

pytestmark = pytest.mark.build

ADD_ONE = """using namespace opbuilder;

TensorPtr add_k(const TensorPtr &x) {
  auto out = std::make_shared<Tensor>(x->dtype(), x->shape());
  const double *p = x->data<double>();
  double *o = out->data<double>();
  for (int64_t i = 0; i < x->numel(); ++i) o[i] = p[i] + K;
  return out;
}
int64_t twice(int64_t v) { return 2 * v; }
"""


@pytest.fixture(scope="module")
def inl(cache_dir):
    return opbuilder.load_inline("inl_ops", "constexpr double K = 1;\n" + ADD_ONE,
                                 functions={"add_k": "x + K", "twice": "2 * v"})


def test_functions_are_bound(inl):
    out = inl.add_k(rt.Tensor(np.array([1.0, 2.0])))
    np.testing.assert_array_equal(np.asarray(out), [2.0, 3.0])
    assert inl.twice(21) == 42
    assert inl.add_k.__doc__.rstrip().endswith("x + K")


def test_sources_written_under_the_cache_by_content(inl, cache_dir):
    dirs = list((cache_dir / "inline" / "inl_ops").iterdir())
    assert len(dirs) == 1
    assert (dirs[0] / "cpp_sources.cpp").read_text() == "constexpr double K = 1;\n" + ADD_ONE
    main = (dirs[0] / "inl_ops.cpp").read_text()
    assert '#include "cpp_sources.cpp"' in main and 'm.def("add_k", &add_k, "x + K");' in main
    again = opbuilder.load_inline("inl_ops", "constexpr double K = 1;\n" + ADD_ONE,
                                  functions={"add_k": "x + K", "twice": "2 * v"})
    assert again is inl  # same strings: the same build, the same module


def test_edited_source_rebuilds(inl, cache_dir):
    m = opbuilder.load_inline("inl_ops", "constexpr double K = 5;\n" + ADD_ONE, functions=["add_k"])
    np.testing.assert_array_equal(np.asarray(m.add_k(rt.Tensor(np.array([1.0])))), [6.0])
    assert not hasattr(m, "twice")
    assert len(list((cache_dir / "inline" / "inl_ops").iterdir())) == 2


def test_functions_are_bound_with_nanobind_unless_the_code_is_written_for_pybind11(inl, cache_dir):
    assert type(inl.twice).__name__ == "nb_func"  # nanobind's function type: the fast-building binding
    pb = opbuilder.load_inline("inl_pb", "#include <pybind11/pybind11.h>\n#include <cstdint>\n"
                               "int64_t four() { return 4; }\n", functions=["four"])
    assert pb.four() == 4
    assert type(pb.four).__name__ == "builtin_function_or_method"  # pybind11's


def test_own_module_block(cache_dir):
    src = ("#include <cstdint>\nint64_t three() { return 3; }\n"
           "PYBIND11_MODULE(OB_EXTENSION_NAME, m) { m.def(\"three\", &three); }\n")
    assert opbuilder.load_inline("inl_own", [src]).three() == 3


def test_compile_error_points_at_the_users_line(cache_dir):
    src = "int f() {\n  return 1;\n}\nint g() { return undefined_thing; }\n"
    with pytest.raises(opbuilder.BuildError) as info:
        opbuilder.load_inline("inl_bad", src)
    msg = str(info.value)
    first = msg.splitlines()[1]
    assert re.fullmatch(r".*/inline/inl_bad/[0-9a-f]{24}/cpp_sources\.cpp:4:18: error: .undefined_thing. was not "
                        r"declared in this scope", first), msg
    assert "4 | int g() { return undefined_thing; }" in msg


def test_bad_arguments(cache_dir):
    with pytest.raises(ValueError, match=r"^load_inline\('inl_x'\): functions must name C\+\+ functions, "
                                         r"got 'not a name'$"):
        opbuilder.load_inline("inl_x", "", functions=["not a name"])
    with pytest.raises(TypeError, match=r"^load_inline\('inl_x'\): the docstring for 'f' must be a string, got int$"):
        opbuilder.load_inline("inl_x", "", functions={"f": 1})
    with pytest.raises(ValueError, match=r"^load_inline: name must be a Python identifier, got 'a-b'$"):
        opbuilder.load_inline("a-b", "")
    with pytest.raises(TypeError, match=r"^load_inline\('inl_x'\): cpp_sources must be a string or a list of "
                                        r"strings$"):
        opbuilder.load_inline("inl_x", [1])


def test_a_warm_load_inline_in_a_new_process_imports_no_hashlib_json_or_builder(inl, cache_dir):
    """A cached load_inline reads its strings' directory and the warm record (warm.py): hashlib
    (OpenSSL), json and the binding scanner (re) were ~12 ms of it in a new process (issue 38)."""
    import json
    import subprocess
    import sys
    import time

    from builder_util import child_env
    from opbuilder.cache.warm_notes import SETTLE_NS

    code = ("import sys, opbuilder\n"
            f"m = opbuilder.load_inline('inl_ops', {('constexpr double K = 1;' + chr(10) + ADD_ONE)!r}, "
            "functions={'add_k': 'x + K', 'twice': '2 * v'})\n"
            "assert m.twice(21) == 42\n"
            "print([n for n in ('hashlib', 'json', 'opbuilder.compile.binding', 'opbuilder.builder') "
            "if n in sys.modules])\n")
    time.sleep(2 * SETTLE_NS / 1e9)  # the build's files settle; the first child writes the warm record
    for _ in range(2):
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                             env=child_env(OPBUILDER_CACHE_DIR=str(cache_dir)))
        assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.strip().replace("'", '"')) == []
