"""Differentiable built-in ops (``runtime.ops.add`` ...) and custom-op entry points."""
from typing import Any

from .math import *  # noqa: F401,F403
from .math import __all__ as _math_all
from .primitive import Primitive, defvjp
from .minmax import argmax, argmin, max, maximum, min, minimum  # noqa: A004
from .softmax_ops import log_softmax, logsumexp, softmax
from .activations import clamp, clip, gelu
from .array_ops import cat, concat, expand_dims, gather, one_hot, split, squeeze, stack
from .dense import dense
from .writes import assign
from . import tensor_methods  # noqa: F401  (attaches Tensor's operators and op methods)

# Names whose modules a first op call does not need (ops.Custom's machinery pulls in json, hashlib,
# ctypes ...): imported on first use by __getattr__ below.
LAZY_NAMES = {"Custom": "custom", "CustomRegOp": "op_info", "DataType": "op_info",
              "custom_info_register": "op_info", "Print": "printing", "print_": "printing",
              "GradOperation": "..autograd.grad_operation", "stop_gradient": "..autograd.grad_operation"}

__all__ = list(_math_all) + ["maximum", "minimum", "softmax", "argmax", "argmin", "max", "min", "clip", "clamp",
                             "gelu", "log_softmax", "logsumexp", "cat", "concat", "expand_dims", "gather",
                             "one_hot", "split", "squeeze", "stack", "dense", "assign", "Primitive", "defvjp", "Custom", "CustomRegOp",
                             "DataType", "custom_info_register", "print_", "Print", "CustomOpBuilder", "kernel",
                             "ms_kernel", "GradOperation", "stop_gradient"]


def __getattr__(name: str) -> Any:
    """``ops.CustomOpBuilder`` is ``opbuilder.CustomOpBuilder`` (imported on first use, as MindSpore's is);
    ``ops.kernel``/``ops.ms_kernel`` mark hybrid DSL functions (runtime.hybrid); ``ops.Custom`` and the
    other LAZY_NAMES import their module on first use and are kept as plain attributes."""
    if name in LAZY_NAMES:
        from importlib import import_module
        where = LAZY_NAMES[name]
        value = getattr(import_module(where, __name__) if where.startswith("..") else
                        import_module(f"{__name__}.{where}"), name)
        globals()[name] = value
        return value
    if name == "CustomOpBuilder":
        from opbuilder import CustomOpBuilder
        return CustomOpBuilder
    if name in ("kernel", "ms_kernel"):  # the hybrid DSL's decorator (runtime.hybrid, imported on first use)
        from .. import hybrid
        return getattr(hybrid, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
