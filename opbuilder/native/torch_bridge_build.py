"""What to_torch's C++ bridge is as a build: its BuildSpec (``bridge_spec``) and what its kind adds to
a plan (``bridge_target``: torch's include directories, C++20, torch's C++ ABI). The builder asks
``bridge_target`` for a spec of this kind; torch_bridge.py builds, loads and runs it. Kept apart from
torch_bridge.py so that the builder, a lower layer, never imports the module that uses it. torch is
imported only when a bridge build is planned."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..cache.fingerprint import digest_of
from .headers import include_dir, source_dir
from ..spec import BuildSpec
from ..compile.target import Target
from ..tools.toolchain import ext_suffix, python_headers

__all__ = ["MODULE", "KIND", "bridge_spec", "bridge_target"]

MODULE = "_opbuilder_torch_bridge"  # also its cache directory's name: _opbuilder_torch_bridge.lib
# the opbuilder headers src/torch_bridge.cpp includes (keyed by their contents: bridge_target)
_HEADERS = ("opbuilder/detail/foreign_api.h", "opbuilder/detail/visibility.h", "opbuilder/detail/core_lib.h")
KIND = "torch_bridge"  # its BuildSpec's kind (builder._target asks bridge_target for its flags)


def _torch_dir() -> Path:
    import torch
    return Path(torch.__file__).parent


def bridge_spec(root: Path, verbose: bool = False) -> BuildSpec:
    """The bridge's build in the cache ``root``: one source against the installed torch, through the
    pipeline every operator takes (builder.py: keyed, locked, trust-checked, verified by its SHA-256,
    published atomically as ``_opbuilder_torch_bridge.lib``, listed by ``cache list``, removed by
    ``cache clean``, found in prebuilt stores). Its compile flags come from ``bridge_target``."""
    lib = _torch_dir() / "lib"
    return BuildSpec(name=MODULE, sources=(source_dir() / "torch_bridge.cpp",), backend="CPU",
                     kind=KIND, include_paths=(), cflags=(), cuda_cflags=(),
                     ldflags=(f"-L{lib}", f"-Wl,-rpath,{lib}", "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"),
                     debug=False, verbose=verbose, root=root)


def bridge_target(spec: BuildSpec) -> Any:
    """What the bridge's kind of build adds to a plan (builder._target): C++20 and torch's C++ ABI, as
    torch's headers require; torch's and Python's include directories keyed by torch's version and
    place and by the Python ABI (not by the contents of their thousands of headers); of opbuilder's
    headers only those it includes are keyed, so an edit of another does not rebuild it."""
    import torch


    tdir = _torch_dir()
    inc = str(tdir / "include")
    api = str(tdir / "include" / "torch" / "csrc" / "api" / "include")
    python_include, abi = python_headers(spec.root)
    cxx11 = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    return Target(MODULE + ext_suffix(), None, ("-isystem", api, "-isystem", inc, "-isystem", python_include),
                   ((api, "<torch api include>"), (inc, "<torch include>"), (python_include, "<python include>")),
                   visibility=("-std=c++20", "-fvisibility=hidden", f"-D_GLIBCXX_USE_CXX11_ABI={cxx11}"),
                   identity=(f"torch={torch.__version__}", f"torch_dir={tdir}", f"python={abi}",
                             f"opbuilder_headers={digest_of([(include_dir() / h).read_text() for h in _HEADERS])}"),
                   reads_headers=False)
