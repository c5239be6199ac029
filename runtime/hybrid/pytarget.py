"""The Python target: the DSL function run as Python over numpy, the reference for the C++ one.

The function's own code object runs with a private copy of its globals to
which the DSL's names are added (``output_tensor``, ``allocate``, the loop
hints, ``grid``, the intrinsics), so the body needs no imports and nothing
is written into the user's module. Elements are numpy scalars, so
arithmetic follows numpy's promotion, as the generated C++ does.
"""
from __future__ import annotations

import itertools
import types
from typing import Any, Callable, Dict, List, Sequence

import numpy as np

from .dsl import INTRINSICS, LOOPS, dtype_name

__all__ = ["run_python", "dsl_namespace"]


def _declare(fill_nan: bool) -> Callable[[Any, Any], np.ndarray]:
    def declare(shape: Any, dtype: Any) -> np.ndarray:
        name = dtype_name(dtype)
        if name is None:
            raise TypeError(f"{dtype!r} is not a dtype of the hybrid DSL")
        out = np.empty(tuple(int(d) for d in shape), np.dtype(name))
        if fill_nan and out.dtype.kind == "f":
            out.fill(np.nan)
        return out
    return declare


def _grid(shape: Any) -> Any:
    return itertools.product(*[range(int(d)) for d in shape])


def dsl_namespace(debug: bool) -> Dict[str, Any]:
    """The names a DSL body sees besides its own: declarations, loops, intrinsics."""
    ns: Dict[str, Any] = dict(INTRINSICS)
    ns.update({name: range for name in LOOPS})
    ns["grid"] = _grid
    ns["output_tensor"] = _declare(debug)
    ns["allocate"] = _declare(debug)
    return ns


def run_python(func: Callable[..., Any], arrays: Sequence[np.ndarray], debug: bool = False) -> List[np.ndarray]:
    """Run ``func`` on numpy arrays with the DSL's names; its outputs as a list."""
    scope = dict(getattr(func, "__globals__", {}))
    scope.update(dsl_namespace(debug))
    code = func.__code__  # type: ignore[attr-defined]
    fn = types.FunctionType(code, scope, code.co_name, None, getattr(func, "__closure__", None))
    res = fn(*arrays)
    return list(res) if isinstance(res, (tuple, list)) else [res]
