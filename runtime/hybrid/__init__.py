"""Hybrid kernels: operators written as Python loops over tensor elements, compiled to C++ by opbuilder.

``@kernel`` (alias ``ms_kernel``) marks a DSL function; ``ops.Custom(f)`` (or
``ops.Custom(f, func_type="hybrid")``, ``"akg"`` as MindSpore spells it)
validates it, generates C++ specialized on the inputs' dtypes and ranks,
builds it once with the builder's cache, and calls it through the aot path.
The pipeline, one module per step: source.py (parse) -> validate.py (the DSL's
rules) -> shapes.py (output shapes) -> cxx.py (C++) -> library.py (build) ->
kernel.py (specializations); pytarget.py runs the same function over numpy;
callee.py holds what inline.py and pytarget.py know of DSL functions.
See docs/hybrid.md.
"""
from .errors import HybridError, HybridOverflowError, HybridSyntaxError, HybridTypeError
from .kernel import DEBUG_ENV, TARGET_ENV, TARGETS, HybridKernel, build_together, kernel, ms_kernel

__all__ = ["HybridKernel", "kernel", "ms_kernel", "build_together", "HybridError", "HybridSyntaxError", "HybridTypeError",
           "HybridOverflowError", "TARGETS", "TARGET_ENV", "DEBUG_ENV"]
