"""``ops.Custom`` for hybrid DSL kernels (func_type "hybrid"/"akg", or a ``@kernel`` function).

Output specs: ``out_shape``/``out_dtype`` when given, else the kernel's
``output_tensor`` declarations evaluated on the input shapes. Given ones are
checked against the declarations (the generated code is specialized on the
outputs' dtypes and ranks, and its loops are sized by the declared shapes),
so a disagreement is a ValueError naming the output, never a write out of
bounds. The call: the specialization for the inputs' (dtype, rank) is built
once and run through the aot call path; the Python target runs the function
itself over numpy.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Protocol, Tuple

import numpy as np

from ..dtypes import from_numpy_dtype
from ..hybrid.errors import HybridTypeError
from ..hybrid.kernel import HybridKernel, signature_of
from .custom_spec import Spec, is_spec_fn

__all__ = ["hybrid_specs", "call_hybrid", "HybridOp"]


class HybridOp(Protocol):
    """What these functions read of an ``ops.Custom`` (custom.py calls them with itself)."""

    name: str
    out_shape: Any
    out_dtype: Any
    _hybrid: Optional[HybridKernel]
    _extra: Any  # the op's ExtraBlock once initialized
    _failed: Any  # the exception type its call path raises for a failed kernel
    _run: Callable[..., Any]  # its call path's run(fn, extra address, arrays, specs, scratch), once loaded

    def _load_path(self) -> None: ...

    def _declared(self, fn: Callable[..., Any], what: str, args: List[Any], want: str) -> Any: ...
    def _normalize(self, shapes: Any, dtypes: Any) -> Tuple[Spec, ...]: ...


def _given(op: HybridOp, arrays: Tuple[np.ndarray, ...], declared: List[Tuple[Any, str]]) -> Tuple[Spec, ...]:
    """The specs out_shape/out_dtype give, the declared ones filling in what they leave out."""
    shapes: Any = op.out_shape
    if is_spec_fn(shapes):
        shapes = op._declared(shapes, "shape", [list(a.shape) for a in arrays],
                              "the output's shape (a list of ints, [] for a scalar) or a list of shapes")
    dtypes: Any = op.out_dtype
    if is_spec_fn(dtypes):
        dtypes = op._declared(dtypes, "dtype", [from_numpy_dtype(a.dtype) for a in arrays],
                              "the output's dtype (e.g. rt.float32) or a list of dtypes")
    if shapes is None:
        shapes = [list(s) for s, _ in declared]
        shapes = shapes[0] if len(shapes) == 1 else shapes
    if dtypes is None:
        dtypes = [d for _, d in declared]
        dtypes = dtypes[0] if len(dtypes) == 1 else dtypes
    return op._normalize(shapes, dtypes)


def hybrid_specs(op: HybridOp, arrays: Tuple[np.ndarray, ...]) -> Tuple[Spec, ...]:
    """The output specs of one call of a hybrid op, checked against the kernel's declarations."""
    hk = op._hybrid
    assert hk is not None
    sig = signature_of(arrays)
    if len(arrays) != len(hk.check().inputs):
        raise TypeError(f"Custom '{op.name}': hybrid kernel takes {len(hk.check().inputs)} inputs "
                        f"({', '.join(hk.check().inputs)}), got {len(arrays)}")
    types = hk.output_types(sig)
    try:
        declared = [(s, d) for s, d in hk.output_specs([a.shape for a in arrays], [a.dtype for a in arrays])]
    except HybridTypeError:
        if op.out_shape is None:
            raise
        declared = [(None, d) for d, _ in types]  # sizes known only to the caller's out_shape
    if op.out_shape is None and op.out_dtype is None:
        return tuple((tuple(s), np.dtype(d)) for s, d in declared)
    given = _given(op, arrays, [(s if s is not None else [0] * r, d) for (s, d), (_, r) in zip(declared, types)])
    if len(given) != len(types):
        raise ValueError(f"Custom '{op.name}': out_shape/out_dtype give {len(given)} output(s), the hybrid kernel "
                         f"returns {len(types)}")
    for k, ((shape, dt), (dshape, ddt), (_, rank)) in enumerate(zip(given, declared, types)):
        if dt != np.dtype(ddt):
            raise ValueError(f"Custom '{op.name}': output {k} has out_dtype {dt.name} but the kernel declares "
                             f"{ddt} (output_tensor); make them agree")
        if len(shape) != rank or (dshape is not None and tuple(shape) != tuple(dshape)):
            want = list(dshape) if dshape is not None else f"rank {rank}"
            raise ValueError(f"Custom '{op.name}': output {k} has out_shape {list(shape)} but the kernel declares "
                             f"{want} (output_tensor) for inputs of shapes {[list(a.shape) for a in arrays]}")
    return given


def call_hybrid(op: HybridOp, arrays: Tuple[np.ndarray, ...], specs: Tuple[Spec, ...]) -> List[np.ndarray]:
    """Run the op's hybrid kernel on ``arrays``: compiled (aot call path) or with the Python target."""
    hk = op._hybrid
    assert hk is not None and op._extra is not None
    if hk.target == "python":
        res = hk(*arrays)
        items = list(res) if isinstance(res, tuple) else [res]
        outs = []
        for o, (shape, dt) in zip(items, specs):
            if o.shape != shape:
                raise ValueError(f"hybrid kernel '{op.name}' (python target) made an output of shape "
                                 f"{list(o.shape)}, out_shape declares {list(shape)}")
            outs.append(np.ascontiguousarray(o, dtype=dt))
        return outs
    k = hk.compiled(signature_of(arrays))
    op._load_path()
    try:
        return list(op._run(k.fn, op._extra.address, arrays, specs, ()))
    except op._failed as e:  # this call's own status and error text (a debug index error, an output size)
        status, err = e.args
    exc = hk.raised(k.symbol, status)  # numpy's ValueError/OverflowError, where the kernel stopped at its check
    if exc is not None:
        raise exc
    raise RuntimeError(f"hybrid kernel '{op.name}' failed" + (f": {err}" if err else f" (status {status})"))
