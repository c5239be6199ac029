"""runtime.jit gives eager's values on every call for C++ functions bound by a module's own macro (issue 33).

A function bound by ``NB_MODULE``'s or (pybind11 >= 3) ``PYBIND11_MODULE``'s ``m.def`` is one node of a trace,
its whole call, as with ``OB_MODULE``: a replay runs its epilogue. A Function applied by anything jit cannot
record whole (a bound class's method, a ``def()`` on a plain module object handed to a helper) stops the trace:
that signature runs eagerly, with a warning that names the fix. Before, such an ``Apply`` was recorded alone,
and every replay dropped the work around it.
"""
from __future__ import annotations

import numpy as np
import pytest

import runtime as rt
from runtime import Tensor, jit, nn

from numeric_util import central
from op_util import CPP, load_op

pytestmark = pytest.mark.build  # builds tests/cpp/jit_raw_nb_ops.cpp and jit_raw_pb_ops.cpp

SOURCES = {"nanobind": "jit_raw_nb_ops.cpp", "pybind11": "jit_raw_pb_ops.cpp"}

STOPPED = (r"not captured: at .*test_jit_raw_modules\.py:\d+, the C\+\+ Function raw_ops::Copy was applied by a "
           r"function jit cannot record whole \(a bound class's method, or a function bound by def\(\) on a "
           r"module object other than the m of OB_MODULE, NB_MODULE or PYBIND11_MODULE\): a replay would not "
           r"repeat its work around Apply; bind it with that m's def\(\) to jit it \(a helper in another source "
           r"takes an opbuilder::ObModule\); this signature runs eagerly")


@pytest.fixture(scope="module", params=list(SOURCES))
def raw(cache_dir, request):
    """A module bound by NB_MODULE (nanobind) or by PYBIND11_MODULE with a class (a pybind11 build)."""
    return load_op(f"jit_raw_{request.param}", [CPP / SOURCES[request.param]], include_paths=[CPP],
                   cflags=["-Wall", "-Wextra", "-Werror"], binding=request.param)


def f64(*values):
    return Tensor(np.array(values, dtype=np.float64))


def test_the_modules_own_def_is_recorded_whole_and_replays_its_epilogue(raw):
    j = jit(lambda x, y: raw.post(x, y))
    assert raw.post(f64(1.0, 2.0), f64(0.0, 0.0)).asnumpy().tolist() == [10.0, 20.0]
    assert [j(f64(1.0, 2.0), f64(0.0, 0.0)).asnumpy().tolist() for _ in range(3)] == [[10.0, 20.0]] * 3
    assert j.traces == 1
    assert [(n.kind, n.op) for n in j.graph(f64(1.0, 2.0), f64(0.0, 0.0)).nodes] == [("cpp", "post")]


@pytest.mark.parametrize("how", ["method", "plain_def"])
def test_an_apply_jit_cannot_record_whole_stops_the_trace(raw, how):
    fn = raw.Poster().post if how == "method" else raw.post_plain
    j = jit(lambda x, y: fn(x, y))
    with pytest.warns(RuntimeWarning, match=STOPPED):
        first = j(f64(1.0, 2.0), f64(0.0, 0.0)).asnumpy().tolist()
    assert [first] + [j(f64(1.0, 2.0), f64(0.0, 0.0)).asnumpy().tolist() for _ in range(2)] == [[10.0, 20.0]] * 3
    assert j.traces == 0
    with pytest.raises(RuntimeError, match=r"this signature has no graph; it runs eagerly because its trace "
                                           r"stopped: at .*the C\+\+ Function raw_ops::Copy was applied"):
        j.graph(f64(1.0, 2.0), f64(0.0, 0.0))


def test_a_function_a_method_picks_by_value_is_picked_and_differentiated_on_every_call(raw):
    p = raw.Poster()
    j = jit(lambda x, flag: p.pick(x * 2.0, flag).sum())
    with pytest.warns(RuntimeWarning, match=STOPPED.replace("Copy", r"ScaleBy<3>")):
        assert j(f64(1.0, -3.0), f64(0.0)) == -12.0
    for flag, k in [(1.0, 2.0), (0.0, 3.0), (1.0, 2.0)]:
        want = central(lambda v: float(np.sum(k * 2.0 * v)), np.array([1.0, -3.0]))
        g = rt.grad(j)(f64(1.0, -3.0), f64(flag))
        np.testing.assert_allclose(g.asnumpy(), want, rtol=1e-7)
        assert j(f64(1.0, -3.0), f64(flag)) == k * 2.0 * -2.0


def test_graph_mode_runs_a_methods_epilogue_on_every_call(graph_mode, raw):
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.poster = raw.Poster()

        def construct(self, x, y):
            return raw.post(self.poster.post(x, y), y)

    net = Net()
    with pytest.warns(RuntimeWarning, match=STOPPED):
        first = net(f64(1.0, 2.0), f64(0.0, 0.0)).asnumpy().tolist()
    assert [first] + [net(f64(1.0, 2.0), f64(0.0, 0.0)).asnumpy().tolist() for _ in range(2)] == [[100.0, 200.0]] * 3
