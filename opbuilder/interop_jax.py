"""Moved to ``opbuilder.bridges.interop_jax`` (the bridges are a layer above the runtime). This alias
keeps code written against the old path working, with a DeprecationWarning naming the new one."""
import sys
import warnings

from .bridges import interop_jax as _moved

warnings.warn("opbuilder.interop_jax moved to opbuilder.bridges.interop_jax", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
