"""runtime: a small dynamic-graph tensor runtime over numpy.

The graph is built as ops run; ``value_and_grad``/``grad`` differentiate
functions and ``nn.Cell`` networks with MindSpore's conventions; operators
built by ``opbuilder`` take part like built-in ones.

``import runtime`` loads only what a first op call needs (tensors, dtypes,
ops, grad mode, jit's tracing flag). The other public names (``nn``,
``mint``, ``graph``, ``value_and_grad``, ``save_checkpoint`` ...) import
their submodule on first use (PEP 562 ``__getattr__`` below), so a process
pays for what it uses; tests/test_lazy_imports.py guards the list.
"""
from importlib import import_module
from typing import Any, Dict, Tuple

from .dtypes import (DType, bfloat16, bool_, complex64, complex128, float16, float32, float64,  # noqa: F401
                     int8, int16, int32, int64, uint8, uint16, uint32, uint64)
from .tensor import Parameter, Tensor, from_numpy  # noqa: F401  (import order: tensor before ops)
from . import ops  # noqa: F401
from . import autograd  # noqa: F401  (already loaded by ops: grad mode, nodes)
from .autograd.grad_mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled  # noqa: F401
from . import context  # noqa: F401  (already loaded by tensor)
from .context import GRAPH_MODE, PYNATIVE_MODE, get_context, set_context  # noqa: F401
from .jit import jit  # noqa: F401  (the decorator; runtime.jit's package is already loaded by ops)

# Submodules imported on first attribute access (``runtime.nn`` ...).
LAZY_MODULES: Tuple[str, ...] = ("nn", "mint", "graph", "cuda", "checkpoint", "hybrid", "seed", "interop")
# Names imported on first access: name -> submodule that defines it.
LAZY_NAMES: Dict[str, str] = {
    "value_and_grad": "autograd.functional", "grad": "autograd.functional",
    "gradcheck": "autograd.gradcheck", "GradcheckError": "autograd.gradcheck",
    "from_dlpack": "interop",
    "set_seed": "seed", "get_seed": "seed",
    "save_checkpoint": "checkpoint", "load_checkpoint": "checkpoint", "load_param_into_net": "checkpoint",
    "ParameterTuple": "nn.wrap",
}


def __getattr__(name: str) -> Any:
    """Imports a lazy submodule or name on first use and keeps it as a plain attribute (later lookups
    never come here)."""
    if name in LAZY_MODULES:
        value: Any = import_module(f"{__name__}.{name}")
    elif name in LAZY_NAMES:
        value = getattr(import_module(f"{__name__}.{LAZY_NAMES[name]}"), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(LAZY_MODULES) | set(LAZY_NAMES))


__all__ = [
    "Tensor", "Parameter", "DType", "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool_", "ops", "nn", "autograd", "value_and_grad", "grad", "no_grad", "enable_grad",
    "set_grad_enabled", "is_grad_enabled", "gradcheck", "GradcheckError",
    "context", "cuda", "from_dlpack", "from_numpy", "set_context", "get_context", "GRAPH_MODE", "PYNATIVE_MODE",
    "mint", "graph", "jit", "set_seed", "get_seed", "save_checkpoint", "load_checkpoint", "load_param_into_net",
    "ParameterTuple",
]
