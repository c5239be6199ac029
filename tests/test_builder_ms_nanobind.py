"""PYBIND11_MODULE sources written for ms_extension.h that only bind plain functions
(``m.def("mul", &fn, "doc")``) are built with nanobind (opbuilder/compile/ms_module.py decides, strictly);
anything else stays on pybind11. The two builds of one source must look the same from Python: the
same results, the same error types and messages for bad inputs, the same argument conversions."""
from __future__ import annotations

import json
import logging
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

import runtime as rt
from builder_util import PYTHON, child_env
from op_util import ROOT
from opbuilder import CustomOpBuilder
from opbuilder.compile.binding import NANOBIND, PYBIND11, detect_binding, why_pybind11
from runtime import Tensor

SEED_003_CPP = ROOT / "tests" / "seeds" / "seed_003" / "custom_src" / "function_ops.cpp"

# a module of seed 003's shape: one function, bound with m.def("name", &function, "doc")
MS_SOURCE = """\
#include <string>
#include "ms_extension.h"

namespace mindspore::pynative {{
namespace autograd {{
{decls}
BaseTensorPtr run_mul(const tensor::BaseTensorPtr &x, const tensor::BaseTensorPtr &y) {{
  auto out = std::make_shared<BaseTensor>(x->data_type(), x->shape());
  custom::CustomLaunchAclnn("aclnnMul", {{x, y}}, {{out}});
  return out;
}}
}}  // namespace autograd
}}  // namespace mindspore::pynative

PYBIND11_MODULE(MS_EXTENSION_NAME, m) {{
  {body}
}}
"""
DEF_MUL = 'm.def("mul", &mindspore::pynative::autograd::run_mul, "x * y");'


def _src(path: Path, decls: str = "", body: str = DEF_MUL, head: str = "") -> Path:
    path.write_text(head + MS_SOURCE.format(decls=decls, body=body))
    return path


# ---- which sources are built with nanobind (no compile) ------------------------------------------
def test_the_seed_003_source_is_built_with_nanobind():
    assert why_pybind11([SEED_003_CPP]) is None
    assert detect_binding("seed", [SEED_003_CPP]) == NANOBIND


def test_the_decision_is_recorded_and_an_edit_decides_again(tmp_path, monkeypatch):
    from opbuilder.compile import binding
    src = _src(tmp_path / "op.cpp")
    record = tmp_path / binding.RECORD
    assert detect_binding("op", [src], record) == NANOBIND

    def no_facts(path):
        raise AssertionError("the sources were tokenized again")
    for name, value in (("_memo", {}), ("_sets", {}), ("_facts_memo", {}), ("_facts", no_facts)):
        monkeypatch.setattr(binding, name, value)  # as a new process, with the record
    assert detect_binding("op", [src], record) == NANOBIND
    monkeypatch.undo()
    _src(src, body=DEF_MUL + '\n  m.def("n", [](int64_t k) { return k; });')  # an int64_t: pybind11
    assert detect_binding("op", [src], record) == PYBIND11


@pytest.mark.parametrize("kw", [
    {},
    {"body": "// the one def\n  " + DEF_MUL + " /* and nothing else */"},
    {"decls": 'const char *kDoc = "py::arg pybind11::object PYBIND11_PLUGIN";'},  # literals are not code
    {"decls": "double Scale(double s) { return s; }",
     "body": DEF_MUL + '\n  m.def("scale", &mindspore::pynative::autograd::Scale, "s");'},
    {"decls": "TensorPtr Maybe(std::optional<TensorPtr> t, const double k) { (void)k; return t ? *t : nullptr; }"
              "\nopbuilder::TensorPtrList Two(TensorPtr a) { return {a, a}; }",
     "body": 'm.def("maybe", &::mindspore::pynative::autograd::Maybe, "m");\n'
             '  m.def("two", mindspore::pynative::autograd::Two, "t");'},
])
def test_plain_function_modules_are_nanobind(tmp_path, kw):
    src = _src(tmp_path / "op.cpp", **kw)
    assert why_pybind11([src]) is None
    assert detect_binding("op", [src]) == NANOBIND


@pytest.mark.parametrize("kw,why", [
    # any other use of pybind11
    ({"body": 'm.def("mul", &mindspore::pynative::autograd::run_mul, "x * y", py::arg("x"), py::arg("y"));'},
     "a pybind11 name"),
    ({"body": 'm.def("first", [](py::object o) { return o; }, "o");'}, "a pybind11 name"),
    ({"body": 'm.def("mul", [](const TensorPtr &x) { return x; }, "x");'}, "a lambda, py::arg, keywords"),
    ({"head": "#include <pybind11/stl.h>\n"}, "#include of pybind11/stl.h"),
    ({"body": DEF_MUL + '\n  m.attr("version") = 2;'}, "holds something other than m.def"),
    ({"body": 'm.def("mul", &mindspore::pynative::autograd::run_mul, "x * y", "x"_a, "y"_a);'},
     "a def is not"),
    ({"decls": "namespace py = pybind11;"}, "a pybind11 name"),
    ({"decls": "PYBIND11_NAMESPACE_BEGIN(x) PYBIND11_NAMESPACE_END(x)"}, "PYBIND11_NAMESPACE_BEGIN"),
    # argument types the two layers convert differently (test_accepted_types_convert_alike shows the others)
    ({"decls": "TensorPtr Pow(const TensorPtr &x, int64_t n) { (void)n; return x; }",
      "body": 'm.def("pow", &mindspore::pynative::autograd::Pow, "p");'}, "pow's function"),
    ({"decls": "TensorPtr Flag(const TensorPtr &x, bool b) { (void)b; return x; }",
      "body": 'm.def("flag", &mindspore::pynative::autograd::Flag, "f");'}, "flag's function"),
    ({"decls": "TensorPtr Named(const TensorPtr &x, const std::string &s) { (void)s; return x; }",
      "body": 'm.def("named", &mindspore::pynative::autograd::Named, "n");'}, "named's function"),
    ({"decls": "TensorPtr Sum(TensorPtrList xs) { return xs[0]; }",
      "body": 'm.def("sum", &mindspore::pynative::autograd::Sum, "s");'}, "sum's function"),
    ({"decls": "TensorPtr Axes(const TensorPtr &x, std::vector<int64_t> a) { (void)a; return x; }",
      "body": 'm.def("axes", &mindspore::pynative::autograd::Axes, "a");'}, "axes's function"),
    ({"decls": "TensorPtr Def(const TensorPtr &x, double k = 2) { (void)k; return x; }",
      "body": 'm.def("def", &mindspore::pynative::autograd::Def, "d");'}, "def's function"),
    # signatures that cannot be read here
    ({"body": 'm.def("mul", &run_mul, "x * y");'}, "mul's function run_mul"),  # found through a using-directive
    ({"decls": "struct K { static TensorPtr F(const TensorPtr &x) { return x; } };",
      "body": 'm.def("f", &mindspore::pynative::autograd::K::F, "f");'}, "f's function"),
    ({"decls": "template <typename T> TensorPtr G(const TensorPtr &x) { return x; }",
      "body": 'm.def("g", &mindspore::pynative::autograd::G<float>, "g");'}, "a def is not"),
    ({"decls": "TensorPtr H(const TensorPtr &x);",
      "body": 'm.def("h", &mindspore::pynative::autograd::H, "h");'}, "h's function"),
    ({"decls": "TensorPtr N(const TensorPtr &x) noexcept { return x; }",
      "body": 'm.def("n", &mindspore::pynative::autograd::N, "n");'}, "n's function"),
    ({"body": DEF_MUL + "\n  " + DEF_MUL}, "mul is defined twice"),
    ({"decls": "using TensorPtr = std::shared_ptr<int>;"}, "a declaration of TensorPtr"),
    ({"head": "#define SCALE 2\n"}, "the directive '#define SCALE 2'"),
    ({"head": "#ifdef OB_BINDING_NANOBIND\n#endif\n"}, "the directive '#ifdef OB_BINDING_NANOBIND'"),
    ({"head": '#include "my_kernels.h"\n'}, "#include of my_kernels.h"),
    ({"head": '#include "opbuilder/extension.h"\n'}, "#include of opbuilder/extension.h"),
])
def test_anything_else_stays_pybind11(tmp_path, kw, why):
    src = _src(tmp_path / "op.cpp", **kw)
    assert why in (why_pybind11([src]) or "")
    assert detect_binding("op", [src]) == PYBIND11


def test_a_function_defined_in_another_source_stays_pybind11(tmp_path):
    main = _src(tmp_path / "main.cpp", decls="TensorPtr Twice(const TensorPtr &x);",
                body='m.def("twice", &mindspore::pynative::autograd::Twice, "t");')
    other = tmp_path / "twice.cpp"
    other.write_text('#include "ms_extension.h"\nnamespace mindspore::pynative::autograd {\n'
                     "TensorPtr Twice(const TensorPtr &x) { return x; }\n}\n")
    assert why_pybind11([main, other]) == ("main.cpp: twice's function mindspore::pynative::autograd::Twice is not "
                                           "defined there with a signature both bindings convert alike")
    assert detect_binding("op", [main, other]) == PYBIND11
    # the helper source alone is fine; with a module of plain functions beside it, the set is nanobind
    assert detect_binding("op", [_src(tmp_path / "plain.cpp"), other]) == NANOBIND


# ---- seed 003's source on both layers ----------------------------------------------------------------
@pytest.fixture(scope="module")
def seed_layers(cache_dir):
    """{binding: seed 003's module}: read from the source (nanobind) and forced to pybind11."""
    layers = {NANOBIND: CustomOpBuilder("ms_nb_seed", [str(SEED_003_CPP)]).load(),
              PYBIND11: CustomOpBuilder("ms_pb_seed", [str(SEED_003_CPP)], binding="pybind11").load()}
    assert {b: type(m.mul).__name__ for b, m in layers.items()} == {
        NANOBIND: "nb_func", PYBIND11: "builtin_function_or_method"}  # two layers, or nothing is compared
    return layers


@pytest.mark.build
def test_the_seed_source_builds_with_nanobind_and_binding_pybind11_keeps_pybind11(seed_layers, cache_dir):
    assert type(seed_layers[NANOBIND].mul).__name__ == "nb_func"
    assert type(seed_layers[PYBIND11].mul).__name__ == "builtin_function_or_method"
    assert seed_layers[NANOBIND].mul.__doc__.endswith("Calculate the value x multiplied by y.")
    # build.json and `cache list` say which binding each build used
    info = {n: json.loads(next((cache_dir / n).glob("*/build.json")).read_text())["binding"]
            for n in ("ms_nb_seed", "ms_pb_seed")}
    assert info == {"ms_nb_seed": "nanobind (a PYBIND11_MODULE source that binds plain functions only)",
                    "ms_pb_seed": "pybind11"}
    listing = subprocess.run([PYTHON, "-m", "opbuilder", "cache", "list", "ms_nb_seed"], env=child_env(),
                             capture_output=True, text=True, timeout=120)
    assert listing.returncode == 0, listing.stderr
    assert "        binding: nanobind (a PYBIND11_MODULE source that binds plain functions only)\n" in listing.stdout


@pytest.mark.build
@pytest.mark.parametrize("sx,sy", [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((), (2, 2))])
def test_the_nanobind_build_gives_the_same_values_and_gradients(seed_layers, sx, sy):
    rng = np.random.default_rng(3)
    x, y = Tensor(rng.standard_normal(sx)), Tensor(rng.standard_normal(sy))
    nb, pb = seed_layers[NANOBIND].mul(x, y).asnumpy(), seed_layers[PYBIND11].mul(x, y).asnumpy()
    np.testing.assert_array_equal(nb, x.asnumpy() * y.asnumpy())
    np.testing.assert_array_equal(nb, pb)
    assert rt.gradcheck(seed_layers[NANOBIND].mul, [x, y])  # float64, central differences


BAD_CALLS = {
    "shapes that do not broadcast": lambda: (Tensor(np.ones(2)), Tensor(np.ones(3))),
    "a dtype no tensor has": lambda: (np.ones(2, np.longdouble), Tensor(np.ones(2))),
    "a string": lambda: (Tensor(np.ones(2)), "not a tensor"),
    "None": lambda: (None, Tensor(np.ones(2))),
    "a Python float": lambda: (Tensor(np.ones(2)), 2.0),
    "a list of tensors": lambda: ([Tensor(np.ones(2))], Tensor(np.ones(2))),
    "one argument": lambda: (Tensor(np.ones(2)),),
    "three arguments": lambda: (Tensor(np.ones(2)),) * 3,
}


def _outcome(fn, args):
    """(exception type, message) of ``fn(*args)``: the whole message, or its first line for pybind11's and
    nanobind's own "incompatible function arguments" (its lists of signatures are written differently)."""
    with pytest.raises(Exception) as info:
        fn(*args)
    msg = str(info.value)
    return type(info.value), msg.splitlines()[0] if "incompatible function arguments" in msg else msg


@pytest.mark.build
@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_inputs_raise_the_same_errors_on_both_layers(seed_layers, case):
    nb = _outcome(seed_layers[NANOBIND].mul, BAD_CALLS[case]())
    pb = _outcome(seed_layers[PYBIND11].mul, BAD_CALLS[case]())
    assert nb == pb
    if case == "shapes that do not broadcast":
        assert nb == (ValueError, "aclnnMul: shapes [2] and [3] cannot be broadcast together")
    elif case == "a dtype no tensor has":
        assert nb[0] is TypeError and nb[1].startswith("opbuilder: unsupported tensor dtype float128; supported: ")
    else:
        assert nb == (TypeError, "mul(): incompatible function arguments. The following argument types are "
                                 "supported:")


# ---- the argument types accepted convert alike ------------------------------------------------------
PROBE = """\
#include <optional>
#include <string>
#include "ms_extension.h"
using mindspore::tensor::BaseTensorPtr;
std::string by_ref(const BaseTensorPtr &t) { return "tensor " + std::to_string(t->numel()); }
std::string by_value(opbuilder::TensorPtr t) { return "tensor " + std::to_string(t->numel()); }
std::string maybe(std::optional<BaseTensorPtr> t) { return t ? "tensor " + std::to_string((*t)->numel()) : "none"; }
std::string real(double v) { return "double " + std::to_string(v); }
std::string real_ref(const double &v) { return "double " + std::to_string(v); }
BaseTensorPtr same(const BaseTensorPtr &t) { return t; }
mindspore::tensor::BaseTensorPtrList twice(const BaseTensorPtr &t) { return {t, t}; }
int64_t count(const BaseTensorPtr &t) { return t->numel(); }
bool is_empty(const BaseTensorPtr &t) { return t->numel() == 0; }
void nothing(double) {}
std::string fail(double which) {
  switch (static_cast<int>(which)) {
    case 0: throw std::invalid_argument("bad argument");
    case 1: throw std::out_of_range("out of range");
    case 2: throw std::domain_error("domain");
    case 3: throw std::length_error("length");
    case 4: throw std::overflow_error("overflow");
    case 5: throw std::range_error("range");
    case 6: throw std::runtime_error("runtime");
    case 7: throw std::logic_error("logic");
    case 8: throw 42;
    default: return "none";
  }
}
PYBIND11_MODULE(MS_EXTENSION_NAME, m) {
  m.def("by_ref", &by_ref, "");
  m.def("by_value", &by_value, "");
  m.def("maybe", &maybe, "");
  m.def("real", &real, "");
  m.def("real_ref", &real_ref, "");
  m.def("same", &same, "");
  m.def("twice", &twice, "");
  m.def("count", &count, "");
  m.def("is_empty", &is_empty, "");
  m.def("nothing", &nothing, "");
  m.def("fail", &fail, "");
}
"""


class _Index:
    def __index__(self):
        return 5


class _Float:
    def __float__(self):
        return 2.5


PROBE_INPUTS = [None, 1, -2 ** 70, 1.5, float("nan"), 1e300, True, np.int64(2), np.int32(3), np.float32(1.5),
                np.float64(2.5), np.bool_(True), "s", b"b", [1, 2], (1.0,), np.array([1, 2]), np.array(3.0),
                np.ones(2, np.longdouble), np.longdouble(1), 1 + 2j, _Index(), _Float(), object()]


@pytest.fixture(scope="module")
def probe_layers(cache_dir, tmp_path_factory):
    src = tmp_path_factory.mktemp("probe") / "probe.cpp"
    src.write_text(PROBE)
    assert detect_binding("probe", [src]) == NANOBIND
    return {NANOBIND: CustomOpBuilder("ms_nb_probe", [str(src)]).load(),
            PYBIND11: CustomOpBuilder("ms_pb_probe", [str(src)], binding="pybind11").load()}


def _result(fn, *args):
    try:
        out = fn(*args)
    except Exception as e:
        msg = str(e)
        return type(e), msg.splitlines()[0] if "incompatible function arguments" in msg else msg
    if isinstance(out, list):
        return [(type(o), o.asnumpy().tolist()) for o in out]
    return (type(out), out.asnumpy().tolist()) if isinstance(out, Tensor) else (type(out), out)


@pytest.mark.build
@pytest.mark.parametrize("fn", ["by_ref", "by_value", "maybe", "real", "real_ref", "nothing"])
def test_accepted_types_convert_alike(probe_layers, fn):
    assert type(getattr(probe_layers[NANOBIND], fn)).__name__ == "nb_func"
    inputs = PROBE_INPUTS + [Tensor(np.ones(3)), np.ones((2, 2), np.float32)]
    for a in inputs:
        nb, pb = _result(getattr(probe_layers[NANOBIND], fn), a), _result(getattr(probe_layers[PYBIND11], fn), a)
        assert nb == pb, f"{fn}({a!r})"


@pytest.mark.build
@pytest.mark.parametrize("fn", ["same", "twice", "count", "is_empty"])
def test_accepted_return_types_convert_alike(probe_layers, fn):
    t = Tensor(np.arange(3.0))
    assert _result(getattr(probe_layers[NANOBIND], fn), t) == _result(getattr(probe_layers[PYBIND11], fn), t)
    assert getattr(probe_layers[NANOBIND], fn)(t) is not None


@pytest.mark.build
@pytest.mark.parametrize("which", range(10))
def test_exceptions_thrown_by_the_function_raise_alike(probe_layers, which):
    # C++ exceptions become the same Python exceptions, with the same messages, on both layers
    assert _result(probe_layers[NANOBIND].fail, which) == _result(probe_layers[PYBIND11].fail, which)


# ---- a nanobind build that fails falls back to pybind11 ----------------------------------------------
@pytest.mark.build
def test_a_failed_nanobind_build_is_built_with_pybind11_and_said(tmp_path, cache_dir, caplog):
    # a global named `nanobind` clashes with nanobind's namespace: only that build fails
    src = _src(tmp_path / "clash.cpp", head="int nanobind = 1;\n")
    assert detect_binding("clash", [src]) == NANOBIND
    with caplog.at_level(logging.WARNING, logger="opbuilder"):
        lib = CustomOpBuilder("ms_clash", [str(src)]).build()
    said = [r.getMessage() for r in caplog.records if "PYBIND11_MODULE" in r.getMessage()]
    assert said == ["opbuilder: ms_clash: building its PYBIND11_MODULE source with nanobind failed; building it "
                    "with pybind11 (binding='pybind11' skips nanobind)"]
    info = json.loads((Path(lib).parent / "build.json").read_text())
    assert info["binding"] == "pybind11"
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="opbuilder"):
        mod = CustomOpBuilder("ms_clash", [str(src)]).load()  # the pybind11 build, found without compiling
    assert not caplog.records
    assert type(mod.mul).__name__ == "builtin_function_or_method"
    np.testing.assert_array_equal(mod.mul(Tensor(np.ones(2)), Tensor(np.full(2, 3.0))).asnumpy(), [3.0, 3.0])
    # a new process (nothing remembered but the cache's records) finds the pybind11 build too
    code = ("from opbuilder import CustomOpBuilder; import sys; "
            "m = CustomOpBuilder('ms_clash', [sys.argv[1]]).load(); print(type(m.mul).__name__)")
    child = subprocess.run([PYTHON, "-c", code, str(src)], capture_output=True, text=True, timeout=120,
                           env=child_env(OPBUILDER_VERBOSE="1"))
    assert child.returncode == 0, child.stderr
    assert (child.stdout.strip(), child.stderr) == ("builtin_function_or_method", "")  # no build, no warning


@pytest.mark.build
def test_a_source_that_uses_pybind11_otherwise_is_built_with_pybind11(tmp_path, cache_dir):
    src = _src(tmp_path / "arg.cpp", body='m.def("mul", &mindspore::pynative::autograd::run_mul, "x * y", '
                                           'pybind11::arg("x"), pybind11::arg("y"));')
    mod = CustomOpBuilder("ms_py_arg", [str(src)]).load()
    assert type(mod.mul).__name__ == "builtin_function_or_method"
    assert re.search(r"mul\(x: runtime\.Tensor, y: runtime\.Tensor\)", mod.mul.__doc__)
