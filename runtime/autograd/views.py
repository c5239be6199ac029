"""Views and the writes into their base, the part of runtime/call_rules.py that the autograd engine
needs too: where a view's elements sit in its base (``view_indices``), the node that makes a view "a
part of its base's current history" (``ViewOfBase``), and ``refresh_view``, torch's rule that a view
made before an in-place write into its base takes its history anew from the base's. It sits below
runtime/call_rules.py (which decides the rules and names these) so the engine, which refreshes views
at the start of a backward, never imports the layer above it."""
from __future__ import annotations

import weakref
from typing import Any, List, Sequence

import numpy as np

from ..versions import share_version
from .grad_mode import _state
from .node import Node

__all__ = ["NO_GRAD_VIEW_STALE", "view_indices", "is_pairs", "pairs", "ViewOfBase", "refresh_view", "grad_tensor", "take",
           "has_internal_overlap", "take_view", "grid", "address"]

# ... and for such a view read after a recorded write into its base (or another view of it)
NO_GRAD_VIEW_STALE = ("a view was created in no_grad mode and its base (or another view of its base) was then "
                      "modified in place with grad mode enabled; whether the view should see that write's "
                      "gradient is ambiguous, so it is refused. Make the view and the write both inside the "
                      "no_grad block or both outside it")


def _byte_offsets(arr: Any, origin: int) -> np.ndarray:
    """The byte offset, from ``origin``, of every element of ``arr`` (an array of ``arr``'s shape)."""
    return grid(arr.shape, arr.strides, _address(arr) - origin)


def grid(shape: Sequence[int], strides: Sequence[int], start: int) -> np.ndarray:
    """``start + index . strides`` for every index of ``shape`` (an int64 array of that shape)."""
    off = np.full(tuple(shape), start, dtype=np.int64)
    for d, (n, st) in enumerate(zip(shape, strides)):
        dims = [1] * len(shape)
        dims[d] = n
        off = off + (np.arange(n, dtype=np.int64) * st).reshape(dims)
    return off


def address(arr: Any) -> int:
    """The address of ``arr``'s first element (numpy or CuPy)."""
    return _address(arr)


def _address(arr: Any) -> int:
    if type(arr) is np.ndarray:
        return arr.__array_interface__["data"][0]
    return arr.data.ptr  # CuPy


def take_view(out: Any, arg: Any) -> None:
    """``out`` is over ``arg``'s memory: a view of it, as the runtime's view ops make one. One version
    counter; its base is ``arg``'s (a view of a view: the first tensor of the chain, while it lives), so an
    in-place write into it follows the view rules; made under no_grad from a base that requires grad (or
    from such a view), a recorded write into it later is refused (torch's rule)."""
    share_version(out, arg)
    ref = arg._base_ref
    if ref is None or ref() is None:
        ref = weakref.ref(arg)
    out._base_ref = ref
    out._view_version = out._vc.value  # its history (set next) is current at this version
    if (not _state.enabled and ref().requires_grad) or arg._view_no_grad:
        out._view_no_grad = True


def view_indices(view: Any, base: Any) -> np.ndarray:
    """For every element of the array ``view``, the flat (C-order) index of the element of ``base`` it
    is: how a view made by slicing, reshaping or transposing ``base`` sits in it. A real view of a
    complex base (``real``, ``imag``: a bit cast) indexes the base's real pairs instead (``pairs``):
    element k's real part is 2k, its imaginary part 2k + 1."""
    item = base.itemsize
    split = is_pairs(view, base)
    if view.dtype != base.dtype and not split:
        raise RuntimeError(f"an in-place write into a view of dtype {view.dtype} of a base of dtype {base.dtype} "
                           f"(a bit cast) cannot be differentiated; write into a copy")
    origin = _address(base)
    b = _byte_offsets(base, origin).ravel()
    if split:  # each complex element is two real ones
        item //= 2
        b = (b[:, None] + np.array([0, item], dtype=np.int64)).ravel()
    lo = int(b.min()) if b.size else 0
    table = np.full(((int(b.max()) - lo) // item + 1) if b.size else 1, -1, dtype=np.int64)
    table[(b - lo) // item] = np.arange(b.size, dtype=np.int64)
    v = _byte_offsets(view, origin) - lo
    pos = v // item
    inside = (v % item == 0) & (pos >= 0) & (pos < table.size)
    idx = np.where(inside, table[np.clip(pos, 0, table.size - 1)], -1)
    if (idx < 0).any():
        raise RuntimeError("an in-place write into a view whose elements are not elements of its base cannot be "
                           "differentiated; write into a copy")
    return idx


def is_pairs(view: Any, base: Any) -> bool:
    """``view`` is a real view of the complex ``base`` (its real or imaginary parts): ``view_indices``
    then indexes the base's real pairs."""
    return base.dtype.kind == "c" and view.dtype.kind == "f" and view.itemsize * 2 == base.itemsize


def pairs(flat: Any) -> Any:
    """The 1-D ``flat`` itself, or, complex, its real pairs (a view: writes reach ``flat``)."""
    return flat.view(flat.real.dtype) if flat.dtype.kind == "c" else flat


def has_internal_overlap(arr: Any) -> bool:
    """Two elements of ``arr`` share one memory location: a stride of 0 over a dimension of size > 1
    (an expanded or broadcast tensor), and it has elements. torch's rule: other overlaps are too costly to
    prove and pass. (Named by call_rules, which decides with it; here for ViewOfBase's gradient.)"""
    strides = arr.strides
    return 0 in strides and any(st == 0 and n > 1 for n, st in zip(arr.shape, strides)) and 0 not in arr.shape


def grad_tensor(arr: Any) -> Any:
    from ..tensor import Tensor
    return Tensor._from_array(arr)


def take(xp: Any, flat: Any, idx: np.ndarray) -> Any:
    """The elements of ``flat`` at ``idx``, in ``idx``'s shape: an array even for a 0-d view's index."""
    return xp.asarray(flat[idx if xp is np else xp.asarray(idx)])


class ViewOfBase(Node):
    """The view's node after the write: the view is a part of its (rebased) base, so its gradient goes
    to the base's node, placed where the view sits (torch's AsStridedBackward over CopySlices)."""

    __slots__ = ("idx", "repeats", "split")
    differentiable = False

    def __init__(self, base_edge: Any, idx: np.ndarray, base_meta: Any, view_meta: Any,
                 repeats: bool = False) -> None:
        self.idx = idx
        self.repeats = repeats  # the view's elements share memory (a broadcast): their gradients add up
        self.split = base_meta[1].kind == "c" and view_meta[1].kind != "c"  # idx indexes the base's real pairs
        self.next_edges = (base_edge,)  # the base's history: (node, index)
        self.input_meta = (base_meta,)
        self.out_meta = (view_meta,)

    name = "view of a base written in place"

    def apply(self, grads: Sequence[Any], create_graph: bool) -> List[Any]:
        from .. import device as _device
        g = grads[0]._data
        shape, dtype = self.input_meta[0]
        xp = np if type(g) is np.ndarray else _device.array_module(g)
        z = xp.zeros(shape, dtype=dtype)
        idx = self.positions()
        where = idx if xp is np else xp.asarray(idx)
        flat = pairs(z.reshape(-1)) if self.split else z.reshape(-1)
        if self.repeats:  # an element read by several of the view's places gets the sum of their gradients
            xp.add.at(flat, where, g)
        else:
            flat[where] = g
        return [grad_tensor(z)]

    def positions(self) -> np.ndarray:
        """For every element of the view, the flat index of the base's element it is."""
        return self.idx

    def release(self) -> None:
        pass


def refresh_view(view: Any) -> None:
    """``view`` (a runtime Tensor with a ``_base_ref``) is about to be an input of a recorded op: if its
    memory was written since its history was set (its version moved on from ``_view_version``) and its
    base has a history, that history may be a recorded write (into the base, or into another view of
    it), which the view's own history does not know. Its history becomes "a part of the base's current
    history", as torch regenerates a view's ``grad_fn`` when its base's version changed. Callers check
    ``view._vc.value != view._view_version`` first (the rare case); the common call pays nothing."""
    version = view._vc.value
    base = view._base_ref()
    if base is None or not base.requires_grad:
        view._view_version = version  # no base, or one without gradients: nothing to regenerate
        return
    if view._view_no_grad:  # torch's rule, for a leaf base too (an optimizer step between the view and its use)
        raise RuntimeError(NO_GRAD_VIEW_STALE)
    if base._node is None:
        view._view_version = version  # a leaf base: the view's own history is still right
        return
    idx = view_indices(view._data, base._data)
    base_meta = (base._data.shape, base._data.dtype)
    view._node = ViewOfBase((base._node, base._out_index), idx, base_meta, (view._data.shape, view._data.dtype),
                            has_internal_overlap(view._data))
    view._out_index = 0
    view.requires_grad = True
    view._view_version = version
