"""C++ backend plugins (register_custom_backend): seed 000's MindSpore-style plugin in process, a native
plugin that runs elementwise nodes itself and delegates the rest, gradients, and every load/run error."""
from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

import runtime as rt
from runtime import Tensor, jit, mint
from runtime.autograd.gradcheck import gradcheck
from runtime.graph import list_backends, register_custom_backend
from opbuilder import build_library
from opbuilder.native.headers import include_dir

from builder_util import child_env
from op_util import CPP, ROOT

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)

SEED_CPP = ROOT / "tests" / "seeds" / "seed_000_custom_backend.cpp"
NATIVE = ["native_backend", "native_grad"] + [f"native_{k}" for k in range(1, 12)]
RNG = np.random.default_rng(11)


@pytest.fixture(scope="session")
def seed_backend(cache_dir):
    path = build_library("custom_backend", [SEED_CPP])
    assert register_custom_backend("my_custom_backend", path) is True
    return path


@pytest.fixture(scope="session")
def native_lib(cache_dir):
    path = build_library("native_backend", [CPP / "native_backend.cpp"], cflags=["-Wall", "-Wextra", "-Werror"])
    for name in NATIVE:
        assert register_custom_backend(name, path) is True
    return path


def lines(text, pattern):
    return [ln for ln in text.splitlines() if re.search(pattern, ln)]


def test_seed_plugin_builds_once_per_signature_and_logs_to_stderr(seed_backend, capfd):
    j = jit(lambda x: mint.sin(x), backend="my_custom_backend")
    x = Tensor(np.ones([2, 2], np.float32))
    np.testing.assert_allclose(j(x).asnumpy(), np.sin(np.ones([2, 2], np.float32)))
    j(Tensor(np.zeros([2, 2], np.float32)))
    z = Tensor(RNG.standard_normal(3))
    np.testing.assert_allclose(j(z).asnumpy(), np.sin(z.asnumpy()), rtol=1e-15)
    err = capfd.readouterr().err
    assert len(lines(err, r"^\[WARNING\] seed_000_custom_backend.cpp:\d+ Build\] MSCustomBackendBase use the "
                          r"origin ms_backend to build the graph\.$")) == 2
    assert len(lines(err, r"^\[WARNING\] seed_000_custom_backend.cpp:\d+ Run\] MSCustomBackendBase use the "
                          r"origin ms_backend to run the graph\.$")) == 3
    assert j.traces == 2


def test_seed_plugin_hands_jit_level_o1_to_ms_backend(seed_backend):
    j = jit(lambda x: mint.cos(mint.sin(x) * 2.0), backend="my_custom_backend", jit_level="O1")
    x = Tensor(RNG.standard_normal((3, 5)))
    np.testing.assert_allclose(j(x).asnumpy(), np.cos(np.sin(x.asnumpy()) * 2.0), rtol=1e-12)


def f_mixed(x, y):
    return mint.sum(mint.sin(x) * y + mint.exp(x) - 2.0, dim=0), mint.cos(x) * y[0]


@pytest.mark.parametrize("dtype,rtol", [(np.float32, 1e-6), (np.float64, 1e-14)])
def test_native_plugin_reads_the_graph_runs_elementwise_nodes_itself_and_delegates_the_rest(native_lib, capfd, dtype,
                                                                                              rtol):
    j = jit(f_mixed, backend="native_backend", log="1")
    x, y = (Tensor(RNG.standard_normal((3, 4)).astype(dtype)) for _ in range(2))
    got = j(x, y)
    for g, w in zip(got, f_mixed(x, y)):
        assert g.dtype == w.dtype
        np.testing.assert_allclose(g.asnumpy(), w.asnumpy(), rtol=rtol, atol=rtol)
    err = capfd.readouterr().err
    name = np.dtype(dtype).name
    assert "native: build f_mixed level=O0 nodes=9" in err
    assert f"native: %5 sum (primitive) %4 axis=ints(0) keepdims=false -> {name}[4]" in err
    assert f"native: %7 getitem (primitive) in1 index=int(0) -> {name}[4]" in err
    assert f"native: %1 mul (primitive) %0 in1 -> {name}[3, 4]" in err
    # sub's 2.0 is a 0-d tensor and mul's y[0] a broadcast: both go back to the runtime, as sum and getitem do
    assert "native: run own: sin mul exp add cos | delegated: sub sum getitem mul" in err


def test_native_plugin_sees_captured_tensors_as_they_are_now(native_lib):
    w = Tensor(RNG.standard_normal(4))
    j = jit(lambda x: mint.tanh(x * w), backend="native_backend")
    x = Tensor(RNG.standard_normal(4))
    np.testing.assert_allclose(j(x).asnumpy(), np.tanh(x.asnumpy() * w.asnumpy()), rtol=1e-15)
    w._data[...] = 3.0
    np.testing.assert_allclose(j(x).asnumpy(), np.tanh(x.asnumpy() * 3.0), rtol=1e-15)
    assert j.traces == 1


def test_gradients_through_plugin_backends_match_central_differences(native_lib, seed_backend):
    for backend in ("native_backend", "my_custom_backend"):
        j = jit(lambda x, y: mint.sin(x) * y + mint.sum(mint.exp(y), dim=0), backend=backend)
        x, y = Tensor(RNG.standard_normal((2, 3))), Tensor(RNG.standard_normal(3))
        gradcheck(j, [x, y])
        g = rt.grad(lambda a: mint.sum(j(a, y)))(x)
        np.testing.assert_allclose(g.asnumpy(), np.cos(x.asnumpy()) * y.asnumpy(), rtol=1e-14)


def test_a_plugin_declared_differentiable_builds_and_runs_the_backward_graph(native_lib, capfd):
    """Backend::Differentiable() -> true: the backward graph is handed to the plugin too, and it runs the
    nodes it knows (cos, mul) with its own loops; gradients still match central differences."""
    j = jit(lambda x, y: mint.sin(x) * y + mint.sum(mint.exp(y), dim=0), backend="native_grad", log="1")
    x, y = Tensor(RNG.standard_normal((2, 3))), Tensor(RNG.standard_normal(3))
    capfd.readouterr()
    g = rt.grad(lambda a: mint.sum(j(a, y)))(x)
    np.testing.assert_allclose(g.asnumpy(), np.cos(x.asnumpy()) * y.asnumpy(), rtol=1e-14)
    err = capfd.readouterr().err
    assert "<lambda>.backward level=O0 nodes=3\n" in err, err
    assert "native: %1 cos (primitive) in0 -> float64[2, 3]" in err
    assert "native: run own: cos mul | delegated: mul" in err  # the backward graph, run by the plugin
    gradcheck(j, [x, y])
    # a second-order gradient is taken through the recorded forward, not handed to the plugin
    gg = rt.grad(lambda a: mint.sum(rt.grad(lambda b: mint.sum(j(b, y)))(a)))(x)
    np.testing.assert_allclose(gg.asnumpy(), -np.sin(x.asnumpy()) * y.asnumpy(), rtol=1e-13)


def test_there_is_no_limit_on_the_number_of_backends(native_lib):
    assert set(NATIVE) <= set(list_backends()) and len(list_backends()) > 10
    x = Tensor(RNG.standard_normal(5))
    np.testing.assert_allclose(jit(mint.exp, backend="native_11")(x).asnumpy(), np.exp(x.asnumpy()), rtol=1e-15)


def test_headers_compile_without_warnings(tmp_path):
    src = tmp_path / "w.cpp"
    src.write_text('#include "opbuilder/backend.h"\n#include "mindspore/include/custom_backend_api.h"\n')
    for f in (src, SEED_CPP, CPP / "native_backend.cpp"):
        res = subprocess.run(["c++", "-std=c++17", "-Wall", "-Wextra", "-Werror", "-fsyntax-only",
                              f"-I{include_dir()}", str(f)], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr


def test_a_plugin_links_nothing_of_ours(native_lib, seed_backend):
    for path in (native_lib, seed_backend):
        needed = subprocess.run(["ldd", path], capture_output=True, text=True).stdout
        assert "libpython" not in needed and "pybind" not in needed and "libstdc++" in needed


# ---- errors ----

def test_missing_file_and_wrong_suffix_are_value_errors(tmp_path):
    with pytest.raises(ValueError, match=r"library not found: .*nothing_here\.so"):
        register_custom_backend("x_missing", tmp_path / "nothing_here.so")
    src = tmp_path / "plugin.cpp"
    src.write_text("int x;\n")
    with pytest.raises(ValueError, match=r"plugin\.cpp is not a shared library \(expected a name ending in \.so\)"):
        register_custom_backend("x_suffix", src)
    with pytest.raises(TypeError, match="backend_name must be a non-empty str"):
        register_custom_backend("", src)


def test_a_library_that_cannot_be_loaded_is_a_runtime_error_naming_file_and_reason(tmp_path):
    bad = tmp_path / "libgarbage.so"
    bad.write_bytes(b"this is not an ELF file")
    with pytest.raises(RuntimeError, match=r"cannot load .*libgarbage\.so: .*(invalid ELF header|too short)"):
        register_custom_backend("x_garbage", bad)
    assert "x_garbage" not in list_backends()


def test_a_library_that_registers_no_backend_is_a_runtime_error(cache_dir):
    plain = build_library("not_a_backend", [CPP / "not_a_backend.cpp"])
    with pytest.raises(RuntimeError, match=r"libnot_a_backend\.so registers no backend: it exports no "
                                           r"opbuilder_backend_init"):
        register_custom_backend("x_plain", plain)
    empty = build_library("empty_backend", [CPP / "empty_backend.cpp"])
    with pytest.raises(RuntimeError, match=r"libempty_backend\.so registers no backend named 'x_empty' "
                                           r"\(it registers: none\)"):
        register_custom_backend("x_empty", empty)
    assert "x_plain" not in list_backends() and "x_empty" not in list_backends()


def test_a_name_the_library_does_not_register_lists_the_ones_it_does(native_lib):
    with pytest.raises(RuntimeError, match=r"registers no backend named 'nativ' \(it registers: native_backend, "
                                           r"native_grad, native_1, native_2"):
        register_custom_backend("nativ", native_lib)


def test_a_name_registered_twice_is_an_error(native_lib, seed_backend):
    with pytest.raises(ValueError, match=r"'native_backend' is already registered \(from .*libnative_backend\.so\)"):
        register_custom_backend("native_backend", native_lib)
    with pytest.raises(ValueError, match=r"'ms_backend' is already registered \(from builtin\)"):
        register_custom_backend("ms_backend", seed_backend)


def test_plugin_failures_are_runtime_errors_with_the_plugins_message(native_lib):
    x = Tensor(RNG.standard_normal(3))
    with pytest.raises(RuntimeError, match=r"backend 'native_1' \(.*libnative_backend\.so\): Build failed: this "
                                           r"graph is refused on purpose"):
        jit(mint.sin, backend="native_1", fail="build")(x)
    with pytest.raises(RuntimeError, match=r"backend 'native_2' .*: Run failed: run refused on purpose"):
        jit(mint.sin, backend="native_2", fail="run")(x)
    with pytest.raises(RuntimeError, match=r"output 0: tensor handle 9999 was not given out by the runtime"):
        jit(mint.sin, backend="native_3", fail="foreign_output")(x)


def test_an_error_in_a_delegated_node_reaches_python_with_its_own_type_and_message(native_lib):
    j = jit(lambda a, b: mint.matmul(a, b), backend="native_4")
    j(Tensor(RNG.standard_normal((2, 3))), Tensor(RNG.standard_normal((3, 2))))  # traced and built: fine
    with pytest.raises(RuntimeError, match=r"backend 'native_4' .*: Run failed: matmul: .*mismatch") as info:
        entry = next(iter(j._cache.values()))
        entry.run([Tensor(np.zeros((2, 3))), Tensor(np.zeros((4, 2)))])  # shapes the graph was not built for
    assert isinstance(info.value.__cause__, ValueError)


def test_ms_log_info_and_debug_print_only_when_verbose_and_exception_fails_the_build(cache_dir):
    lib = build_library("ms_log_backend", [CPP / "ms_log_backend.cpp"], cflags=["-Wall", "-Wextra", "-Werror"])
    script = (f"import numpy as np\nfrom runtime import Tensor, jit, mint\nfrom runtime.graph import "
              f"register_custom_backend\nregister_custom_backend('logging_backend', {str(lib)!r})\n"
              f"print(jit(mint.sin, backend='logging_backend', jit_level='O1')(Tensor(np.zeros(2))))\n"
              f"try:\n    jit(mint.cos, backend='logging_backend', **{{'raise': '1'}})(Tensor(np.zeros(2)))\n"
              f"except RuntimeError as e:\n    print(e)\n")
    out = {}
    for verbose in ("0", "1"):
        res = subprocess.run([sys.executable, "-c", script], env=child_env(OPBUILDER_VERBOSE=verbose),
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        out[verbose] = res
    quiet, loud = out["0"].stderr, out["1"].stderr
    assert lines(quiet, r"^\[ERROR\] ms_log_backend.cpp:\d+ Build\] error: first node sin$")
    assert not lines(quiet, r"^\[(INFO|DEBUG)\]")
    assert lines(loud, r"^\[INFO\] ms_log_backend.cpp:\d+ Build\] info: 1 nodes$")
    assert lines(loud, r"^\[DEBUG\] ms_log_backend.cpp:\d+ Build\] debug: level O1$")
    assert out["0"].stdout.splitlines()[1] == (f"backend 'logging_backend' ({lib}): Build failed: asked to fail, 42")


def test_a_plugin_delegating_a_cpp_function_op_runs_its_forward_once_per_gradient_call(native_lib, capfd):
    """The plugin hands the op (forward graph) and its <op>.backward node (backward graph) back to the
    runtime: the backward calls the node the forward recorded instead of running the op again."""
    from op_util import load_op
    counted = load_op("jit_counted_ops", [CPP / "jit_counted_ops.cpp"], cflags=["-Wall", "-Wextra", "-Werror"])
    w = Tensor(RNG.standard_normal(4))
    j = jit(lambda x: mint.sin(counted.scaled_mul(mint.exp(x), w, 2.0)), backend="native_grad", log="1")
    x = Tensor(RNG.standard_normal(4))
    g = rt.grad(lambda a: mint.sum(j(a)))
    g(x)
    capfd.readouterr()
    before = counted.forwards()
    got = g(x)
    assert counted.forwards() - before == 1
    err = capfd.readouterr().err
    # the module function's whole call is the node (PYBIND11_MODULE's m.def, as OB_MODULE's)
    assert "native: run own: exp sin | delegated: scaled_mul\n" in err, err  # the forward, as before
    assert "delegated: scaled_mul.backward" in err, err
    e = np.exp(x.asnumpy())
    np.testing.assert_allclose(got.asnumpy(), np.cos(2 * e * w.asnumpy()) * 2 * w.asnumpy() * e, rtol=1e-13)
    gradcheck(j, [x])
