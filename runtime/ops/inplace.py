"""Inputs an operator writes in place, as its op-info declares them (``.input(0, "x", inplace=True)``).

Before the call each declared input is checked: it must be a Tensor or numpy
array (not a number), writable (``writeable=False`` memory, such as a
``bytes`` buffer or a read-only memory map, is refused with a ``ValueError``
rather than written), without internal overlap (a stride-0 view: torch's
refusal, runtime/call_rules.py), not partly over another input (``b[1:]``
written while ``b[:-1]`` is read: torch's refusal too; the same elements in
the same layout, ``add_(x, x)``, pass), and, while gradients are recorded,
must not require grad, nor be a view made under no_grad of a tensor that
does (torch's refusal too). One that is not C-contiguous is handed to the
kernel as a contiguous copy and written back afterwards. After the call a written Tensor's version
goes up, so a graph node that saved it reports the change at backward.

Inputs not declared here are never written through: the call path gives the
kernel a private copy of any read-only one (aot_call.cpp).
"""
from __future__ import annotations

from typing import Any, List, Sequence, Tuple

import numpy as np

from .. import call_rules
from .. import device as _device
from ..autograd.grad_mode import _state
from ..tensor import Tensor

__all__ = ["InplaceWrites"]

WriteBack = List[Tuple[np.ndarray, np.ndarray]]


class InplaceWrites:
    """The checks and bookkeeping around one op's declared in-place inputs."""

    __slots__ = ("op", "indices")

    def __init__(self, op: str, indices: Sequence[int]) -> None:
        self.op = op
        self.indices = tuple(indices)

    def before(self, inputs: Sequence[Any], arrays: Tuple[np.ndarray, ...]) -> Tuple[Tuple[np.ndarray, ...],
                                                                                      WriteBack]:
        """The arrays to pass (contiguous stand-ins where needed) and what to copy back after the call."""
        out = list(arrays)
        back: WriteBack = []
        for i in self.indices:
            if i >= len(inputs):
                raise TypeError(f"Custom '{self.op}' writes its input {i} in place (its reg_info says inplace), "
                                f"but was called with {len(inputs)} input(s)")
            x, a = inputs[i], arrays[i]
            if not isinstance(x, (Tensor, np.ndarray)):
                raise TypeError(f"Custom '{self.op}' writes its input {i} in place, so it must be a Tensor or a "
                                f"numpy array, not a {type(x).__name__}")
            if not _device.writeable(a):
                raise ValueError(f"Custom '{self.op}' writes its input {i} in place (its reg_info says inplace), "
                                 f"but that array is read-only (writeable=False: a bytes buffer, a read-only "
                                 f"memory map, or a flag its owner set); nothing was written. Pass a writable "
                                 f"copy, e.g. Tensor(x.asnumpy().copy())")
            if call_rules.has_internal_overlap(a):  # torch's rule: never into memory elements share
                raise RuntimeError(f"Custom '{self.op}' writes its input {i} in place (its reg_info says inplace): "
                                   f"{call_rules.OVERLAP_MESSAGE}")
            if any(j != i and call_rules.has_partial_overlap(a, b) for j, b in enumerate(arrays)):
                raise RuntimeError(f"Custom '{self.op}' writes its input {i} in place (its reg_info says inplace), "
                                   f"and another input shares part of its memory: "
                                   f"{call_rules.PARTIAL_OVERLAP_MESSAGE}")
            if _state.enabled and isinstance(x, Tensor) and call_rules.no_grad_view_refused(x):
                raise RuntimeError(f"Custom '{self.op}' writes its input {i} in place (its reg_info says inplace): "
                                   f"{call_rules.NO_GRAD_VIEW_WRITE}")
            if _state.enabled and isinstance(x, Tensor) and x.requires_grad:
                raise RuntimeError(f"Custom '{self.op}' writes its input {i} in place, and that input requires "
                                   f"grad: an in-place write cannot be differentiated here. Call it under "
                                   f"runtime.no_grad(), or on a tensor that does not require grad")
            if not (a.flags.c_contiguous and getattr(a.flags, "aligned", True)):  # CuPy's are always aligned
                out[i] = np.ascontiguousarray(a)
                back.append((a, out[i]))
        return tuple(out), back

    def after(self, inputs: Sequence[Any], back: WriteBack) -> None:
        """Copy the stand-ins back and bump the versions of the Tensors written."""
        for original, written in back:
            np.copyto(original, written)
        for i in self.indices:
            x = inputs[i]
            if isinstance(x, Tensor):
                x._version += 1
