"""An aot source built with build options: include paths, compile flags and link flags."""
import shutil
from pathlib import Path

import numpy as np
import pytest

import runtime as rt
from opbuilder import build_library
from runtime import Tensor, ops

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)

ROOT = Path(__file__).resolve().parents[1]
ADD = str(ROOT / "custom_src" / "aot_add.cpp")

KERNEL = """\
#include <cstdint>
#include "offset.h"          // from an include path
extern "C" float helper_scale(float v);  // from a library given in ldflags

extern "C" int Shift(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                     void *extra) {
  (void)nparam; (void)dtypes; (void)stream; (void)extra;
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; ++d) n *= shapes[0][d];
  const float *x = static_cast<const float *>(params[0]);
  float *y = static_cast<float *>(params[1]);
  for (int64_t i = 0; i < n; ++i) y[i] = helper_scale(x[i]) + OFFSET + EXTRA;  // EXTRA: from cflags
  return 0;
}
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory, cache_dir):
    """A kernel source, a header directory, and a helper library to link (built once)."""
    d = tmp_path_factory.mktemp("aot_build_options")
    (d / "include").mkdir()
    (d / "include" / "offset.h").write_text("#define OFFSET 100.0f\n")
    (d / "shift.cpp").write_text(KERNEL)
    (d / "helper.cpp").write_text('extern "C" float helper_scale(float v) { return 2.0f * v; }\n')
    helper = Path(build_library("aot_helper_scale", [d / "helper.cpp"]))
    link = [f"-L{helper.parent}", f"-l:{helper.name}", f"-Wl,-rpath,{helper.parent}"]
    return d, link


def shift_op(project, extra="1.0f"):
    d, link = project
    return ops.Custom(f"{d / 'shift.cpp'}:Shift", out_shape=lambda x: x, out_dtype=lambda x: x,
                      include_paths=[d / "include"], cflags=[f"-DEXTRA={extra}"], ldflags=link)


def test_include_paths_cflags_and_ldflags_reach_the_build(project):
    op = shift_op(project)
    assert op(Tensor([1.0, 2.0], rt.float32)).tolist() == [103.0, 105.0]


def test_other_flags_are_another_build_of_the_same_source(project):
    one, two = shift_op(project, "1.0f"), shift_op(project, "5.0f")
    assert one._kernel.library != two._kernel.library
    assert two(Tensor([0.0], rt.float32)).tolist() == [105.0]
    assert shift_op(project, "1.0f")._kernel.library == one._kernel.library  # the cached build again


def test_flags_given_as_one_string(tmp_path):
    src = tmp_path / "add.cpp"
    shutil.copy(ADD, src)
    op = ops.Custom(f"{src}:CustomAdd", out_shape=[1], out_dtype=np.float32, cflags="-O1 -DUNUSED=1")
    assert op(Tensor([1.0]), Tensor([2.0])).item() == 3.0


def test_a_quoted_flag_in_one_string_stays_one_flag(tmp_path):
    """One string is split as a shell splits it: '-DMSG="a b"' was two flags ('-DMSG="a' and 'b"'), and the
    compile failed (the command line has no other way to pass a flag with a space)."""
    src = tmp_path / "msg.cpp"
    src.write_text('#include <cstdint>\n#define S(x) #x\n#define XS(x) S(x)\n'
                   'extern "C" int Len(int, void **params, int *, int64_t **, const char **, void *, void *) {\n'
                   '  static_cast<float *>(params[1])[0] = sizeof(XS(MSG)) - 1;\n  return 0;\n}\n')
    op = ops.Custom(f"{src}:Len", out_shape=[1], out_dtype=np.float32, cflags='-O1 -DMSG="a b"')
    assert op(Tensor([0.0])).item() == 3.0  # "a b"
    with pytest.raises(ValueError, match=r"^cflags: cannot split '-DMSG=\"a' into flags: No closing quotation$"):
        ops.Custom(f"{src}:Len", out_shape=[1], out_dtype=np.float32, cflags='-DMSG="a')


def test_without_its_include_path_the_source_does_not_compile(project):
    from opbuilder import BuildError
    d, link = project
    with pytest.raises(BuildError, match="offset.h"):
        ops.Custom(f"{d / 'shift.cpp'}:Shift", out_shape=lambda x: x, out_dtype=lambda x: x, ldflags=link)


def test_build_options_errors(project, tmp_path):
    lib = build_library("aot_add_for_options", [ADD])
    with pytest.raises(ValueError, match=r"include_paths, cflags and ldflags build an aot source; .*\.so \(from func "
                                         r".*\) is a prebuilt library: pass its source"):
        ops.Custom(f"{lib}:CustomAdd", out_shape=[1], out_dtype=rt.float32, cflags=["-O3"])
    with pytest.raises(ValueError, match="include_paths, cflags and ldflags build an aot source; pyfunc 'absolute' is not "
                                         "built"):
        ops.Custom(np.abs, func_type="pyfunc", include_paths=[tmp_path])
    with pytest.raises(FileNotFoundError, match=r"include path of operator 'aot_aot_add_.*' is not a directory: "
                                                r".*nowhere"):
        ops.Custom(f"{ADD}:CustomAdd", out_shape=[1], out_dtype=rt.float32, include_paths=[tmp_path / "nowhere"])
    with pytest.raises(TypeError, match="cflags must be strings, got int"):
        ops.Custom(f"{ADD}:CustomAdd", out_shape=[1], out_dtype=rt.float32, cflags=[3])
