"""An example package of operators: ``sq_mul(x, y) = x * x * y`` in C++, with its backward.

The same line serves development and the installed wheel: in a checkout ``load()`` builds the source
on first use; from a wheel built by ``opbuilder.build_meta`` it loads the shipped binary (no compiler).
"""
from pathlib import Path

from opbuilder import CustomOpBuilder

ops = CustomOpBuilder("shipped_ops", [str(Path(__file__).parent / "csrc" / "sq_mul.cpp")]).load()
sq_mul = ops.sq_mul

__all__ = ["ops", "sq_mul"]
