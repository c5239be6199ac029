"""A copy of opbuilder's headers (a vendored or older ``include/``) searched before the installed ones
is refused by name before anything compiles: the operator would compile against the copy and run on
the core library built from the installed headers (a crash), or silently get the installed headers
through the precompiled header. An identical copy changes nothing and builds."""
from __future__ import annotations

import re
import shutil

import pytest

from op_util import load_op
from opbuilder import BuildError, CustomOpBuilder
from opbuilder.native.headers import include_dir

pytestmark = pytest.mark.build  # a load() probes the compiler before it refuses (tests/build_guard.py)

SOURCE = """\
#include "opbuilder/extension.h"
using namespace opbuilder;
OB_MODULE(m) { m.def("numel", [](const TensorPtr &x) { return x->numel(); }); }
"""


def _copy(dest, edit: bool):
    """``dest``/opbuilder: a copy of the installed headers, tensor.h edited if ``edit``."""
    shutil.copytree(include_dir() / "opbuilder", dest / "opbuilder")
    if edit:
        with open(dest / "opbuilder" / "tensor.h", "a") as f:
            f.write("// an older copy\n")
    return dest


def _message(name: str, d, how: str) -> str:
    return (f"building operator '{name}' failed: {d} ({how}) holds another copy of opbuilder's headers, searched "
            f"before the installed ones, and its opbuilder/tensor.h differs from {include_dir() / 'opbuilder/tensor.h'}; "
            f"the operator would compile against the copy but run on the installed opbuilder's core library and "
            f"runtime (or, with the precompiled header, silently use the installed headers): remove {d} from the "
            f"include path (opbuilder puts its own headers on it), or install the opbuilder version that copy "
            f"belongs to")


@pytest.mark.parametrize("how", ["include_paths", "-I in cflags", "-iquote in cflags"])
def test_a_different_copy_on_the_include_path_is_refused_naming_it(tmp_path, cache_dir, how):
    vendored = _copy(tmp_path / "vendor" / "include", edit=True)
    (tmp_path / "src").mkdir()
    src = tmp_path / "src" / "copy_ops.cpp"
    src.write_text(SOURCE)
    kw = ({"include_paths": [vendored]} if how == "include_paths"
          else {"cflags": [how.split()[0], str(vendored)]})
    with pytest.raises(BuildError, match=re.escape(_message("copy_ops", vendored, how))):
        CustomOpBuilder("copy_ops", [src], **kw).load()


def test_a_different_copy_beside_the_source_is_refused_naming_it(tmp_path, cache_dir):
    _copy(tmp_path, edit=True)  # "opbuilder/extension.h" is looked up beside the source first
    src = tmp_path / "beside_ops.cpp"
    src.write_text(SOURCE)
    with pytest.raises(BuildError, match=re.escape(_message("beside_ops", tmp_path, "the directory of beside_ops.cpp"))):
        CustomOpBuilder("beside_ops", [src]).load()


def test_a_different_copy_on_cpath_is_refused_naming_it(tmp_path, cache_dir, monkeypatch):
    vendored = _copy(tmp_path / "vendor", edit=True)
    (tmp_path / "src").mkdir()
    src = tmp_path / "src" / "cpath_ops.cpp"
    src.write_text(SOURCE)
    monkeypatch.setenv("CPATH", str(vendored))
    with pytest.raises(BuildError, match=re.escape(_message("cpath_ops", vendored, "CPATH"))):
        CustomOpBuilder("cpath_ops", [src]).load()


def test_an_identical_copy_builds(tmp_path, cache_dir):
    import numpy as np

    import runtime as rt
    vendored = _copy(tmp_path / "same" / "include", edit=False)
    src = tmp_path / "same_ops.cpp"
    src.write_text(SOURCE)
    ops = load_op("same_ops", [src], include_paths=[vendored])
    assert ops.numel(rt.Tensor(np.ones((2, 3), np.float32))) == 6


PYBIND11_SOURCE = """\
#include "opbuilder/extension.h"
#include <pybind11/pybind11.h>
using namespace opbuilder;
static std::int64_t Numel(const TensorPtr &x) { return x->numel(); }
PYBIND11_MODULE(OB_EXTENSION_NAME, m) { m.def("numel", &Numel); }
"""


def test_an_identical_copy_builds_a_module_that_compiles_the_core_inline(tmp_path, cache_dir):
    """A pybind11 module compiles the core's bodies (src/core/) inline; the copy's headers include them by a
    path relative to themselves, where the copy has no src/: they are found beside the installed headers."""
    import numpy as np

    import runtime as rt
    vendored = _copy(tmp_path / "same" / "include", edit=False)
    src = tmp_path / "same_pb_ops.cpp"
    src.write_text(PYBIND11_SOURCE)
    ops = load_op("same_pb_ops", [src], include_paths=[vendored])
    assert ops.numel(rt.Tensor(np.ones((2, 3), np.float32))) == 6


def test_a_copy_read_another_way_is_refused_after_the_compile(tmp_path, cache_dir):
    """-include of a copy: no include directory holds it, the depfile names it (headers.copy_read)."""
    vendored = _copy(tmp_path / "vendor", edit=False)
    header = vendored / "opbuilder" / "extension.h"
    header.write_text(header.read_text() + "// an older copy\n")
    src = tmp_path / "forced_ops.cpp"
    src.write_text(SOURCE)
    with pytest.raises(BuildError, match=re.escape(
            f"building operator 'forced_ops' failed: it compiled against {header}, a copy of opbuilder's "
            f"opbuilder/extension.h that differs from the installed {include_dir() / 'opbuilder/extension.h'}; the "
            f"operator would run on the installed opbuilder's core library and runtime, built from the installed "
            f"headers: include opbuilder's headers as \"opbuilder/...\" from the installed opbuilder only (no path "
            f"to a copy in #include or -include)")):
        CustomOpBuilder("forced_ops", [src], cflags=["-include", str(header)]).load()
