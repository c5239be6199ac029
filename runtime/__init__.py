"""runtime: a small dynamic-graph tensor runtime over numpy.

The graph is built as ops run; ``value_and_grad``/``grad`` differentiate
functions and ``nn.Cell`` networks with MindSpore's conventions; operators
built by ``opbuilder`` take part like built-in ones.
"""
from .dtypes import (DType, bool_, float16, float32, float64, int8, int16, int32, int64,  # noqa: F401
                     uint8)
from .tensor import Parameter, Tensor, from_numpy  # noqa: F401  (import order: tensor before ops)
from . import ops  # noqa: F401
from . import nn  # noqa: F401
from . import autograd  # noqa: F401
from .autograd.functional import grad, value_and_grad  # noqa: F401
from .autograd.grad_mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled  # noqa: F401
from .autograd.gradcheck import GradcheckError, gradcheck  # noqa: F401
from . import context, cuda, mint  # noqa: F401
from .interop import from_dlpack  # noqa: F401
from .context import GRAPH_MODE, PYNATIVE_MODE, get_context, set_context  # noqa: F401
from . import graph  # noqa: F401
from .jit import jit  # noqa: F401
from .seed import get_seed, set_seed  # noqa: F401
from .checkpoint import load_checkpoint, load_param_into_net, save_checkpoint  # noqa: F401

__all__ = [
    "Tensor", "Parameter", "DType", "float16", "float32", "float64", "int8", "int16", "int32", "int64",
    "uint8", "bool_", "ops", "nn", "autograd", "value_and_grad", "grad", "no_grad", "enable_grad",
    "set_grad_enabled", "is_grad_enabled", "gradcheck", "GradcheckError",
    "context", "cuda", "from_dlpack", "from_numpy", "set_context", "get_context", "GRAPH_MODE", "PYNATIVE_MODE",
    "mint", "graph", "jit", "set_seed", "get_seed", "save_checkpoint", "load_checkpoint", "load_param_into_net",
]
