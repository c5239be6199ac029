"""Moved to ``opbuilder.bridges.interop_torch`` (the bridges are a layer above the runtime). This alias
keeps code written against the old path working, with a DeprecationWarning naming the new one."""
import sys
import warnings

from .bridges import interop_torch as _moved

warnings.warn("opbuilder.interop_torch moved to opbuilder.bridges.interop_torch", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
