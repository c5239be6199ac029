"""Each nanobind operator registers the C++ classes it binds in a registry of its own (a nanobind
domain per module, include/opbuilder/nanobind.h): two operators that each bind a ``class Acc`` of
different layouts both import, and neither's functions accept the other's objects."""
from __future__ import annotations

import re
import warnings

import pytest

from op_util import load_op

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)

ACC = """\
#include "opbuilder/extension.h"
namespace nb = nanobind;
class Acc {{  // the same name in both operators, another layout
 public:
  {fields}
  void add(double v) {{ {add} }}
  double read() const {{ return {read}; }}
}};
OB_MODULE(m) {{
  nb::class_<Acc>(m, "Acc").def(nb::init<>()).def("add", &Acc::add);
  m.def("total", [](const Acc &a) {{ return a.read(); }});
}}
"""
LAYOUTS = {
    "acc_small": dict(fields="double sum = 0;", add="sum += v;", read="sum"),
    "acc_large": dict(fields="long n = 0; double parts[16] = {};", add="parts[n++ % 16] += 2 * v;",
                      read="parts[0] + parts[15] + n"),
}


@pytest.fixture(scope="module")
def acc_ops(tmp_path_factory, cache_dir):
    d = tmp_path_factory.mktemp("domains")
    with warnings.catch_warnings():
        # nanobind's "type 'Acc' was already registered!" (the second Acc dropped) fails the set-up
        warnings.filterwarnings("error", message="nanobind: type", category=RuntimeWarning)
        mods = {}
        for name, layout in LAYOUTS.items():
            src = d / f"{name}.cpp"
            src.write_text(ACC.format(**layout))
            mods[name] = load_op(name, [src])
    return mods


def test_two_operators_binding_a_class_of_one_name_each_get_their_own(acc_ops):
    small, large = acc_ops["acc_small"], acc_ops["acc_large"]
    a, b = small.Acc(), large.Acc()
    a.add(1.5)
    b.add(1.5)
    assert type(a).__module__ == "acc_small" and type(b).__module__ == "acc_large"
    assert type(a) is not type(b)
    assert small.total(a) == 1.5
    assert large.total(b) == 3.0 + 1  # parts[0] + parts[15] + n


@pytest.mark.parametrize("fn,other", [("acc_small", "acc_large"), ("acc_large", "acc_small")])
def test_an_operator_refuses_the_other_operators_object(acc_ops, fn, other):
    obj = acc_ops[other].Acc()
    with pytest.raises(TypeError, match=re.escape(f"total(): incompatible function arguments. The following "
                                                  f"argument types are supported:\n    1. total(arg: {fn}.Acc, /)")):
        acc_ops[fn].total(obj)
