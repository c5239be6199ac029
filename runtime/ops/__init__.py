"""Differentiable built-in ops (``runtime.ops.add`` ...) and custom-op entry points."""
from .math import *  # noqa: F401,F403
from .math import __all__ as _math_all
from .primitive import Primitive, defvjp
from .custom import Custom
from .op_info import CustomRegOp, DataType, custom_info_register

__all__ = list(_math_all) + ["Primitive", "defvjp", "Custom", "CustomRegOp", "DataType", "custom_info_register"]
