"""opbuilder: build C++/CUDA tensor operators on first use and load them.

``CustomOpBuilder(name, sources, backend="CPU").load()`` compiles the sources
(once; cached by content) into a pybind11 module written against the C++ API
in ``opbuilder/extension.h`` and returns it. See docs/builder.md.
"""
from .builder import CustomOpBuilder, build_library
from .errors import BuildError, ToolchainError, UnsafeCacheDirError
from .headers import include_dir

__all__ = ["CustomOpBuilder", "build_library", "BuildError", "ToolchainError", "UnsafeCacheDirError", "include_dir", "load"]
__version__ = "0.1.0"


def load(name, sources, **kwargs):
    """Shorthand for ``CustomOpBuilder(name, sources, **kwargs).load()``."""
    return CustomOpBuilder(name, sources, **kwargs).load()
