"""What the framework bridges (``to_torch``, ``to_jax``) share: finding a module's
functions, describing call signatures, and the ``Spec`` a shape rule returns.

A shape rule (``shape_fn``) is framework-neutral: it is called with the op's
arguments, each tensor replaced by a ``Spec`` (shape tuple, numpy dtype), and
returns one ``Spec`` or a list of them, one per output. A C++ ``Function`` with
``InferShape`` bound as ``<name>_infer_shape`` gives that rule itself
(``companion_shape_fns``). No framework is imported here.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

__all__ = ["Spec", "module_functions", "check_shape_fns", "as_specs", "companion_shape_fns", "COMPANION",
           "plain_static"]

# the suffix of the function a module binds next to an op for its C++ InferShape
COMPANION = "_infer_shape"


class Spec(NamedTuple):
    """The shape and dtype of one tensor, as a shape rule sees and returns it."""
    shape: Tuple[int, ...]
    dtype: np.dtype


ShapeFn = Callable[..., Union[Spec, Sequence[Spec]]]


def plain_static(a: Any) -> Any:
    """A numpy bool, integer or float scalar as the Python value it holds (``.item()``: exact), in lists
    too: ``to_jax`` and ``to_torch`` take ``np.int64(2)`` as the static ``2`` and ``np.float64(-0.0)``
    as ``-0.0`` (then keyed by type and exact value as such). Anything else is returned as it is."""
    if isinstance(a, np.generic) and a.dtype.kind in "biuf":
        return a.item()
    if isinstance(a, (list, tuple)) and any(isinstance(e, (np.generic, list, tuple)) for e in a):
        return type(a)(plain_static(e) for e in a)
    return a


def module_functions(module: Any) -> Dict[str, Callable]:
    """The public functions of a loaded operator module, by name (``<op>_infer_shape`` companions left out)."""
    out = {}
    names = dir(module)
    for name in names:
        if name.startswith("_") or (name.endswith(COMPANION) and name[:-len(COMPANION)] in names):
            continue
        f = getattr(module, name)
        if callable(f) and not isinstance(f, type):
            out[name] = f
    if not out:
        raise ValueError(f"{getattr(module, '__name__', module)!r} has no public functions to wrap")
    return out


def check_shape_fns(who: str, funcs: Dict[str, Callable], shape_fn: Optional[Dict[str, ShapeFn]]) -> Dict[str, ShapeFn]:
    """``shape_fn`` checked: a dict from function names of the module to callables."""
    if shape_fn is None:
        return {}
    if not isinstance(shape_fn, dict):
        raise TypeError(f"{who}: shape_fn must be a dict from function name to a callable, got "
                        f"{type(shape_fn).__name__}")
    for name, fn in shape_fn.items():
        if name not in funcs:
            raise ValueError(f"{who}: shape_fn names {name!r}, which the module does not define "
                             f"(it has {', '.join(sorted(funcs))})")
        if not callable(fn):
            raise TypeError(f"{who}: shape_fn[{name!r}] is a {type(fn).__name__}, not a callable")
    return dict(shape_fn)


def as_specs(who: str, result: Any) -> Tuple[List[Spec], bool]:
    """A shape rule's result as a list of ``Spec`` and whether the op returns a single tensor."""
    single = isinstance(result, Spec) or (isinstance(result, tuple) and len(result) == 2
                                          and not isinstance(result[0], Spec) and not isinstance(result[1], Spec)
                                          and isinstance(result[0], (tuple, list)))
    if not single and not isinstance(result, (list, tuple)):
        raise TypeError(f"{who}: the shape rule must return Spec(shape, dtype) or a list of them, got {result!r}")
    items = [result] if single else list(result)
    specs = []
    for r in items:
        try:
            shape, dtype = r
            specs.append(Spec(tuple(int(d) for d in shape), np.dtype(dtype)))
        except (TypeError, ValueError):
            raise TypeError(f"{who}: the shape rule must return Spec(shape, dtype) or a list of them, "
                            f"got {r!r}") from None
    return specs, single


def _meta(spec: Spec) -> np.ndarray:
    """An array of ``spec``'s shape and dtype over one element (strides 0): what a C++ InferShape reads."""
    return np.broadcast_to(np.zeros((), spec.dtype), spec.shape)


def _companion_rule(name: str, companion: Callable) -> ShapeFn:
    """A shape rule that asks the C++ InferShape (through its bound companion) instead of running the op."""
    def rule(*args: Any) -> Union[Spec, List[Spec]]:
        conv = [_meta(a) if isinstance(a, Spec) else
                [_meta(e) if isinstance(e, Spec) else e for e in a] if isinstance(a, list) else a for a in args]
        out = companion(*conv)
        if isinstance(out, (list, tuple)):
            return [Spec(tuple(o.shape), np.dtype(o._data.dtype)) for o in out]
        return Spec(tuple(out.shape), np.dtype(out._data.dtype))
    rule.__name__ = rule.__qualname__ = f"{name}{COMPANION}"
    return rule


def companion_shape_fns(module: Any, funcs: Dict[str, Callable], given: Dict[str, ShapeFn]) -> Dict[str, ShapeFn]:
    """``given`` plus, for each function without a rule there, the rule of its ``<name>_infer_shape``
    companion (bound from a C++ Function's InferShape), if the module has one."""
    out = dict(given)
    for name in funcs:
        companion = getattr(module, name + COMPANION, None)
        if name not in out and callable(companion):
            out[name] = _companion_rule(name, companion)
    return out
