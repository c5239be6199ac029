"""Shared fixtures: one cache directory per test session, each test operator built once."""
from __future__ import annotations

import os

import pytest

# JAX on a machine with a GPU puts its arrays there; the interop tests are about host memory (to_jax's
# callbacks, zero-copy DLPack of CPU arrays), so the session's JAX is the CPU's unless one says otherwise
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# to_torch's C++ bridge compiles against torch's headers (~15 s): tests that want it turn it on
# through the `torch_bridge` fixture; every other to_torch call takes the Python path
os.environ.setdefault("OPBUILDER_TORCH_BRIDGE", "0")
# opbuilder's installed runtime (hatch_build.py, after `pip install -e .`) is off: the suite tests the
# builds of nanobind's runtime and the core library in its cache; tests/test_shipping.py tests the installed one
os.environ.setdefault("OPBUILDER_INSTALLED_RUNTIME", "0")

from op_util import BINDINGS, CPP, CUSTOM_SRC, ROOT, load_op  # noqa: F401  (helpers live there)

# fixtures whose setup compiles: every test using one is marked `build` (tests/build_guard.py)
BUILD_FIXTURES = frozenset({
    "my_ops", "ms_ops", "api_ops", "autograd_ops", "dtype_ops", "aot_dtype_lib",
    "aclnn_ops", "assign_add", "big_cache", "built", "counted", "cu",
    "cuda_ops", "diff_kernels", "gemm_lib", "host_so", "mul_ops", "name_kernels",
    "native_lib", "nvcc", "own_ops", "xla_ffi_ops", "project", "seed_003_ops", "seed_backend",
    "seed_ms_ops", "seed_ops", "dlpack_ops", "shape_ops", "seed_so", "swish_ops", "torch_leaky_relu_lib",
    "torch_bridge", "torch_path", "inplace_view_ops", "filled",
})


def pytest_configure(config):
    from build_guard import BuildGuard
    config.pluginmanager.register(BuildGuard(BUILD_FIXTURES), "build_guard")


def _session_cache(config) -> "os.PathLike[str]":
    """The session's cache directory, made on first use (the collection hook below may be first)."""
    if not hasattr(config, "_opbuilder_cache"):
        if os.environ.get("PYTEST_XDIST_WORKER"):  # one cache for all workers of the run: each op
            # compiles once (the cache's locks serialize concurrent first builds, as for any processes)
            d = config._tmp_path_factory.getbasetemp().parent / "opbuilder-cache"
            d.mkdir(exist_ok=True)
            config._opbuilder_cache = d
        else:
            config._opbuilder_cache = config._tmp_path_factory.mktemp("opbuilder-cache")
    return config._opbuilder_cache


def pytest_collection_finish(session):
    """When a selected test needs to_torch's bridge, start its ~15 s build now, before the first test:
    it compiles on the second core while the tests run (one process), instead of in a test's setup."""
    if not any("torch_bridge" in getattr(item, "fixturenames", ()) for item in session.items):
        return
    try:
        import torch  # noqa: F401
    except ImportError:
        return
    from opbuilder.bridges import torch_bridge as bridge
    mp = pytest.MonkeyPatch()
    mp.setenv("OPBUILDER_CACHE_DIR", str(_session_cache(session.config)))
    mp.setenv(bridge.ENV, "1")
    try:
        bridge.ready(until_started=True)  # every compiler it starts is started here (tests/build_guard.py)
    finally:
        mp.undo()


@pytest.fixture(scope="session", autouse=True)
def cache_dir(request):
    """OPBUILDER_CACHE_DIR for the whole session (so ops compile once per session)."""
    d = _session_cache(request.config)
    old = os.environ.get("OPBUILDER_CACHE_DIR")
    os.environ["OPBUILDER_CACHE_DIR"] = str(d)
    yield d
    if old is None:
        os.environ.pop("OPBUILDER_CACHE_DIR", None)
    else:
        os.environ["OPBUILDER_CACHE_DIR"] = old


@pytest.fixture
def graph_mode():
    """The runtime's GRAPH_MODE for one test (every Cell call runs as jit would), then PYNATIVE_MODE."""
    import runtime as rt
    rt.set_context(mode=rt.GRAPH_MODE)
    yield
    rt.set_context(mode=rt.PYNATIVE_MODE)


@pytest.fixture(scope="session", params=BINDINGS)
def dlpack_ops(cache_dir, request):
    """tests/cpp/dlpack_ops.cpp bound with each layer (the casters of both take DLPack objects)."""
    return load_op("dlpack_ops", [CPP / "dlpack_ops.cpp"], cflags=["-Wall", "-Wextra", "-Werror"],
                   binding=request.param)


@pytest.fixture(scope="session")
def inplace_view_ops(cache_dir):
    """tests/cpp/inplace_view_ops.cpp: MarkDirty ops that write views (the in-place tests)."""
    return load_op("inplace_view_ops", [CPP / "inplace_view_ops.cpp"], cflags=["-Wall", "-Wextra", "-Werror"],
                   binding="nanobind")


@pytest.fixture(scope="session")
def torch_bridge(cache_dir):
    """to_torch's C++ bridge (opbuilder/bridges/torch_bridge.py), built once per session; a test turns it on
    for its own to_torch calls with OPBUILDER_TORCH_BRIDGE=1 (see `torch_path` in test_interop_torch.py)."""
    pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")
    from opbuilder.bridges import torch_bridge as bridge
    mp = pytest.MonkeyPatch()
    mp.setenv(bridge.ENV, "1")
    try:
        module = bridge.ready(wait=True)
    finally:
        mp.undo()
    assert module is not None, bridge.status()
    return module


@pytest.fixture
def bridged_mul(my_ops, torch_bridge, monkeypatch):
    """custom_src/function_ops.cpp's mul (saves both inputs) through to_torch with the C++ bridge on, its
    signature warmed: later calls take the bridge."""
    import torch

    import opbuilder
    monkeypatch.setenv("OPBUILDER_TORCH_BRIDGE", "1")
    ns = opbuilder.to_torch(my_ops)
    ns.mul(torch.ones(3), torch.ones(3))
    return ns


@pytest.fixture(params=["registered", "bridge"])
def torch_route(request, monkeypatch):
    """to_torch's two eager routes: the registered operator (OPBUILDER_TORCH_BRIDGE=0) and the C++ bridge."""
    if request.param == "bridge":
        request.getfixturevalue("torch_bridge")
        monkeypatch.setenv("OPBUILDER_TORCH_BRIDGE", "1")
    else:
        monkeypatch.setenv("OPBUILDER_TORCH_BRIDGE", "0")
    return request.param


@pytest.fixture(scope="session")
def my_ops(cache_dir):
    return load_op("my_ops", [CUSTOM_SRC / "function_ops.cpp"])


@pytest.fixture(scope="session")
def ms_ops(cache_dir):
    return load_op("ms_ops", [CUSTOM_SRC / "ms_style_ops.cpp"])


@pytest.fixture(scope="session")
def api_ops(cache_dir):
    return load_op("tensor_api_ops", [CPP / "tensor_api_ops.cpp"])


@pytest.fixture(scope="session")
def dtype_ops(cache_dir):
    """tests/cpp/dtype_ops.cpp: ops on bfloat16, complex and uint16/32/64 (test_dtypes_cpp, test_interop_dtypes)."""
    return load_op("dtype_ops", [CPP / "dtype_ops.cpp"], cflags=["-Wall", "-Wextra", "-Werror"])


@pytest.fixture(scope="session", params=BINDINGS)
def autograd_ops(cache_dir, request):
    """tests/cpp/autograd_ops.cpp bound with each layer: Function<T>'s behaviour is shared."""
    # the headers' templates instantiated by a real build must be warning-free too
    return load_op("autograd_ops", [CPP / "autograd_ops.cpp"], cflags=["-Wall", "-Wextra", "-Werror"],
                 binding=request.param)
