"""Moved to ``opbuilder.bridges.torch_bridge`` (the bridges are a layer above the runtime). This alias
keeps code written against the old path working, with a DeprecationWarning naming the new one."""
import sys
import warnings

from .bridges import torch_bridge as _moved

warnings.warn("opbuilder.torch_bridge moved to opbuilder.bridges.torch_bridge", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
