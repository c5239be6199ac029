"""Shared fixtures: one cache directory per test session, each test operator built once."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CUSTOM_SRC = ROOT / "custom_src"
CPP = Path(__file__).resolve().parent / "cpp"

# fixtures whose setup compiles: every test using one is marked `build` (tests/build_guard.py)
BUILD_FIXTURES = frozenset({
    "my_ops", "ms_ops", "api_ops", "autograd_ops", "dtype_ops", "aot_dtype_lib",
    "aclnn_ops", "assign_add", "big_cache", "built", "counted", "cu",
    "cuda_ops", "diff_kernels", "gemm_lib", "host_so", "mul_ops", "name_kernels",
    "native_lib", "nvcc", "own_ops", "xla_ffi_ops", "project", "seed_003_ops", "seed_backend",
    "seed_ms_ops", "seed_ops", "dlpack_ops", "shape_ops", "seed_so", "swish_ops", "torch_leaky_relu_lib",
})


def pytest_configure(config):
    from build_guard import BuildGuard
    config.pluginmanager.register(BuildGuard(BUILD_FIXTURES), "build_guard")


@pytest.fixture(scope="session", autouse=True)
def cache_dir(tmp_path_factory):
    """OPBUILDER_CACHE_DIR for the whole session (so ops compile once per session)."""
    d = tmp_path_factory.mktemp("opbuilder-cache")
    old = os.environ.get("OPBUILDER_CACHE_DIR")
    os.environ["OPBUILDER_CACHE_DIR"] = str(d)
    yield d
    if old is None:
        os.environ.pop("OPBUILDER_CACHE_DIR", None)
    else:
        os.environ["OPBUILDER_CACHE_DIR"] = old


def _load(name, sources, **kw):
    from opbuilder import CustomOpBuilder
    return CustomOpBuilder(name, [str(s) for s in sources], **kw).load()


@pytest.fixture(scope="session")
def my_ops(cache_dir):
    return _load("my_ops", [CUSTOM_SRC / "function_ops.cpp"])


@pytest.fixture(scope="session")
def ms_ops(cache_dir):
    return _load("ms_ops", [CUSTOM_SRC / "ms_style_ops.cpp"])


@pytest.fixture(scope="session")
def api_ops(cache_dir):
    return _load("tensor_api_ops", [CPP / "tensor_api_ops.cpp"])


@pytest.fixture(scope="session")
def dtype_ops(cache_dir):
    """tests/cpp/dtype_ops.cpp: ops on bfloat16, complex and uint16/32/64 (test_dtypes_cpp, test_interop_dtypes)."""
    return _load("dtype_ops", [CPP / "dtype_ops.cpp"], cflags=["-Wall", "-Wextra", "-Werror"])


BINDINGS = ("nanobind", "pybind11")


@pytest.fixture(scope="session", params=BINDINGS)
def autograd_ops(cache_dir, request):
    """tests/cpp/autograd_ops.cpp bound with each layer: Function<T>'s behaviour is shared."""
    # the headers' templates instantiated by a real build must be warning-free too
    return _load("autograd_ops", [CPP / "autograd_ops.cpp"], cflags=["-Wall", "-Wextra", "-Werror"],
                 binding=request.param)
