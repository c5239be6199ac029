"""The Python target: the DSL function run as Python over numpy, the reference for the C++ one.

The function's own code object runs with a private copy of its globals to
which the DSL's names are added (``output_tensor``, ``allocate``, the loop
hints, ``grid``, the intrinsics), so the body needs no imports and nothing
is written into the user's module. Elements are numpy scalars, so
arithmetic follows numpy's promotion, as the generated C++ does.
"""
from __future__ import annotations

import itertools
import sys
import types
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from .callee import Callee
from .dsl import INTRINSICS, LOOPS, dtype_name
from .errors import negative_size_message

__all__ = ["run_python", "dsl_namespace"]


def _declare(what: str, fill_nan: bool, zeros: bool = False) -> Callable[[Any, Any], np.ndarray]:
    def declare(shape: Any, dtype: Any) -> np.ndarray:
        name = dtype_name(dtype)
        if name is None:
            raise TypeError(f"{dtype!r} is not a dtype of the hybrid DSL")
        dims = tuple(int(d) for d in shape)
        if any(d < 0 for d in dims):  # numpy's ValueError, naming the place as the compiled target does
            caller = sys._getframe(1)  # the DSL function's frame: its file, line and name
            raise ValueError(negative_size_message(caller.f_code.co_filename, caller.f_lineno, what,
                                                   caller.f_code.co_name))
        if zeros:  # allocate: zero-filled, as the generated C++ allocates it
            return np.zeros(dims, np.dtype(name))
        out = np.empty(dims, np.dtype(name))
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
    ns["output_tensor"] = _declare("output_tensor", debug)
    ns["allocate"] = _declare("allocate", debug, zeros=True)
    return ns


def _call(callee: "Callee", debug: bool) -> Callable[..., Any]:
    """A called DSL function as the caller's body sees it: run by this target, one output or a tuple."""
    def run(*args: Any) -> Any:
        outs = run_python(callee.func, [np.asarray(a) for a in args], debug, callee.calls)
        return outs[0] if len(outs) == 1 else tuple(outs)
    return run


def run_python(func: Callable[..., Any], arrays: Sequence[np.ndarray], debug: bool = False,
               calls: Optional[Dict[str, "Callee"]] = None) -> List[np.ndarray]:
    """Run ``func`` on numpy arrays with the DSL's names; its outputs as a list.

    ``calls``: the DSL functions it calls, by name (inline.py found them), run by this target too.
    """
    scope = dict(getattr(func, "__globals__", {}))
    scope.update(dsl_namespace(debug))
    scope.update({name: _call(c, debug) for name, c in (calls or {}).items()})
    code = func.__code__  # type: ignore[attr-defined]
    fn = types.FunctionType(code, scope, code.co_name, None, getattr(func, "__closure__", None))
    res = fn(*arrays)
    return list(res) if isinstance(res, (tuple, list)) else [res]
