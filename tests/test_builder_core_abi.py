"""Operators whose C++ library ABI differs from the core library's (core_lib.py): every spelling of an
ABI-changing macro compiles the core inline (flags: the builder; a ``#define`` in a source:
detail/core_lib.h), and a flag that changes the layout of every struct is refused by name."""
from __future__ import annotations

import re

import numpy as np
import pytest

import runtime as rt
from op_util import load_op
from opbuilder import CustomOpBuilder, build_library

OPS = """\
{define}#include "opbuilder/extension.h"
#include <vector>
using namespace opbuilder;
OB_MODULE(m) {{
  // numel and shape cross into the core: with debug containers on one side only they read garbage
  m.def("numel", [](const TensorPtr &x) {{ std::vector<int> v(3); return x->numel() + int64_t(v.size()); }});
  m.def("shape", [](const TensorPtr &x) {{ return x->shape(); }});
}}
"""
DEBUG_BUILDS = {  # name: (what the source starts with, cflags)
    "abi_define": ("#define _GLIBCXX_DEBUG 1  // debug containers, chosen in the source\n", []),
    "abi_two_args": ("", ["-D", "_GLIBCXX_DEBUG"]),
    "abi_wp": ("", ["-Wp,-D_GLIBCXX_DEBUG"]),
}
OLD_STRING = {  # gcc's dual ABI: the pre-C++11 std::string, chosen in the source or by a flag
    "abi_old_string": ("#define _GLIBCXX_USE_CXX11_ABI 0  // the old std::string and std::list\n", []),
    "abi_old_string_flag": ("", ["-D_GLIBCXX_USE_CXX11_ABI=0"]),
}


@pytest.mark.build
@pytest.mark.parametrize("name", sorted(DEBUG_BUILDS))
def test_debug_containers_in_any_spelling_build_the_core_inline(tmp_path_factory, cache_dir, name):
    define, cflags = DEBUG_BUILDS[name]
    src = tmp_path_factory.mktemp(name) / f"{name}.cpp"
    src.write_text(OPS.format(define=define))
    ops = load_op(name, [src], cflags=cflags)
    x = rt.Tensor(np.ones((2, 3), np.float32))
    assert ops.numel(x) == 6 + 3
    assert list(ops.shape(x)) == [2, 3]
    if cflags:  # seen by the builder: the core library is not even loaded
        assert CustomOpBuilder(name, [src], cflags=cflags).core_library() is None


LAYOUT_MESSAGE = ("operator '{name}' cannot be built with '{flag}' in {what}: it changes how every struct and "
                  "function the sources see is laid out or called, including those of opbuilder, the binding "
                  "library, Python and the C++ library, which are compiled without it, so the operator would "
                  "read their data wrongly (wrong values, std::bad_alloc, crashes); apply it to your own types "
                  "only (#pragma pack(push, 1) ... #pragma pack(pop), or __attribute__((packed)) on a struct), "
                  "or remove it")


@pytest.mark.parametrize("flags,flag", [
    (["-fpack-struct=1"], "-fpack-struct=1"),
    (["-O2", "-fpack-struct"], "-fpack-struct"),
    (["-fshort-enums"], "-fshort-enums"),
    (["-mlong-double-64"], "-mlong-double-64"),
    (["-m32"], "-m32"),
])
def test_a_flag_that_changes_every_structs_layout_is_refused_by_name(tmp_path, flags, flag):
    src = tmp_path / "packed.cpp"
    src.write_text(OPS.format(define=""))
    with pytest.raises(ValueError, match=re.escape(LAYOUT_MESSAGE.format(name="packed", flag=flag, what="cflags"))):
        CustomOpBuilder("packed", [src], cflags=flags)
    with pytest.raises(ValueError, match=re.escape(LAYOUT_MESSAGE.format(name="packed", flag=flag, what="cflags"))):
        build_library("packed", [src], cflags=flags)


def test_the_defaults_spelled_out_are_not_refused(tmp_path):
    src = tmp_path / "plain.cpp"
    src.write_text(OPS.format(define=""))
    CustomOpBuilder("plain", [src], cflags=["-mabi=sysv", "-mlong-double-80", "-m3dnow"])  # no error


@pytest.mark.build
def test_headers_included_under_pragma_pack_fail_to_compile_saying_why(tmp_path, cache_dir):
    from opbuilder import BuildError
    src = tmp_path / "pragma_packed.cpp"
    src.write_text(OPS.format(define="#pragma pack(push, 1)  // meant for the operator's own structs\n"))
    with pytest.raises(BuildError, match=re.escape(
            "opbuilder's headers are included under #pragma pack (or built with -fpack-struct): their structs, "
            "and those of the binding library, Python and the C++ library, would be laid out unlike the "
            "compiled code they are passed to; include them before #pragma pack(push, n) and end the packed "
            "region with #pragma pack(pop)")):
        CustomOpBuilder("pragma_packed", [src]).load()


@pytest.mark.build
@pytest.mark.parametrize("name", sorted(OLD_STRING))
def test_the_old_std_string_in_any_spelling_builds_the_core_inline(tmp_path_factory, cache_dir, name):
    """The README operator (a Function<T>, whose names reach the core as std::string) with gcc's old
    string ABI: it was an 'undefined symbol ... DisplayName' at import when the source chose it."""
    from pathlib import Path
    define, cflags = OLD_STRING[name]
    readme_op = Path(__file__).resolve().parent.parent / "custom_src" / "function_ops.cpp"
    src = tmp_path_factory.mktemp(name) / f"{name}.cpp"
    src.write_text(define + readme_op.read_text())
    ops = load_op(name, [src], cflags=cflags)
    x0, y0 = np.array([0.5, -2.0]), np.array([3.0, 1.5])
    x = rt.Tensor(x0.copy(), requires_grad=True)
    z = ops.mul(x, rt.Tensor(y0))
    assert z.numpy().tolist() == (x0 * y0).tolist()
    z.sum().backward()
    assert x.grad.numpy().tolist() == y0.tolist()
