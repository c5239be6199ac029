"""The autograd engine: grad mode, graph nodes, the backward pass."""
from .engine import backward, grad
from .function import Function, FunctionCtx, once_differentiable
from .grad_mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from .node import Node

__all__ = ["backward", "grad", "no_grad", "enable_grad", "set_grad_enabled", "is_grad_enabled", "Node",
           "Function", "FunctionCtx", "once_differentiable"]
