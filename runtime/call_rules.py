"""One place decides the semantics of an op call, for every route it takes.

Every route an op call can take (runtime eager, a Python ``Function``, a C++
``Function<T>`` through include/opbuilder/autograd.h, jit replay, the torch and
JAX adapters) asks this module, rather than deciding for itself:

* which inputs may be written: ``write_refusal`` / ``check_writable`` give
  torch's ``check_inplace`` rules for an input marked dirty (MarkDirty,
  ``ctx.mark_dirty``): a leaf that requires grad is refused, so is a view of
  one, and so is an input with internal overlap (an expanded, stride-0
  tensor). They are decided before Forward runs, from the inputs alone;
* what a refusal leaves untouched: everything. An input that would be refused
  is protected (``protect`` / ``Protected.restore``) while Forward runs, and
  put back before the error is raised, so the caller's data never changes.
  Protecting copies the input, so it is done only where a write can happen:
  each operator type (a ``Function`` subclass, a C++ ``Function<T>``) learns
  from its calls whether it writes its inputs (``WRITES_ATTR``,
  ``note_writes``, ``note_read_only_call``). Its inputs are protected until a
  recorded call of it completed without writing, and on every call once one
  wrote (``mark_dirty``/``MarkDirty``, or a write found without it); other
  calls keep nothing and pay nothing (a parameter is not copied per call).
  The one hole: an operator that writes its inputs only on some calls (say
  only for some argument values) is protected from the first call that
  writes on; that call's refusal is still raised, by the same rules, but
  after the write, and an unmarked write is then found by the sampled
  fingerprint as before. torch itself checks a custom Function's
  ``mark_dirty`` only after its forward ran;
* version counters and outputs aliasing inputs: an output that is an input
  returned unchanged shares that input's version counter (``share_alias``), as
  a torch view does, so a later write through either is seen by every check;
* in-place writes into a view: the base's history is rebased (``rebase_view``,
  torch's CopySlices), so a gradient through the base sees the write; a view
  made before a recorded write into its base (or into another view of it) gets
  its history anew when it is next used (``refresh_view``, torch's regenerated
  view ``grad_fn``): it remembers the version of its memory at which its
  history was set (``_view_version``), and a moved version makes it "a part of
  the base's current history";
* double backward through an operator whose Backward records no graph: one
  named error (``double_backward_message``), never a silent zero;
* the complex-gradient convention of each framework (``COMPLEX_GRADIENT``,
  ``to_framework_cotangent``): the runtime and torch use the conjugate
  convention, JAX does not.

The C++ counterpart is include/opbuilder/detail/call_rules.h, which decides the
same rules for Function<T> and calls ``rebase_view`` and ``share_alias`` here.
"""
from __future__ import annotations

import weakref
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from .autograd.grad_mode import _state
from .autograd.node import Node, double_backward_message  # noqa: F401  (decided there, named here)
from .versions import share_version
from .autograd.views import (NO_GRAD_VIEW_STALE, ViewOfBase, address, grad_tensor, grid,  # noqa: F401
                             has_internal_overlap, refresh_view, take, take_view, view_indices, pairs)  # (named here: call_rules decides, views.py is below it)

__all__ = ["OVERLAP_MESSAGE", "PARTIAL_OVERLAP_MESSAGE", "has_partial_overlap", "no_grad_view_refused",
           "COMPLEX_GRADIENT", "has_internal_overlap", "write_refusal", "check_writable",
           "Protected", "protect", "WRITES_ATTR", "note_writes", "note_read_only_call", "share_alias",
           "rebase_view", "refresh_view", "refresh_view_arg", "NO_GRAD_VIEW_WRITE", "double_backward_message",
           "to_framework_cotangent"]

# torch's words for a write into a view made under no_grad of a base that requires grad, while recording
NO_GRAD_VIEW_WRITE = ("a view was created in no_grad mode and is being modified in place with grad mode enabled; "
                      "whether that write should be differentiated is ambiguous, so it is refused. Make the view "
                      "and the write both inside the no_grad block (the write is not recorded) or both outside it")
# torch's words for a write into memory that several elements share (at::assert_no_internal_overlap)
OVERLAP_MESSAGE = ("unsupported operation: more than one element of the written-to tensor refers to a single "
                   "memory location. Please clone() the tensor before performing the operation.")
# torch's words for a write whose target part-overlaps another argument (at::assert_no_partial_overlap)
PARTIAL_OVERLAP_MESSAGE = ("unsupported operation: some elements of the input tensor and the written-to tensor "
                           "refer to a single memory location. Please clone() the tensor before performing the "
                           "operation.")

# Per framework: does its gradient of a real loss with respect to z = x + iy read dL/dx + i dL/dy
# ("conjugate", torch's and the runtime's), or its conjugate ("plain", JAX's cotangents)?
COMPLEX_GRADIENT = {"runtime": "conjugate", "torch": "conjugate", "jax": "plain"}


def to_framework_cotangent(g: Any, framework: str) -> Any:
    """A runtime gradient ``g`` (an array) in ``framework``'s convention: conjugated for JAX's
    cotangents, unchanged for torch's and the runtime's (and for real arrays)."""
    if COMPLEX_GRADIENT[framework] == "plain" and np.iscomplexobj(g):
        return g.conj()
    return g


def _dense_span(arr: Any) -> Optional[Tuple[int, int]]:
    """The bytes [start, end) a host array covers when its elements fill them with no gap or overlap
    (torch's "non-overlapping and dense", any order of dimensions); None otherwise."""
    if not isinstance(arr, np.ndarray) or arr.size == 0:
        return None
    dims = sorted((abs(st), n) for n, st in zip(arr.shape, arr.strides) if n > 1)
    step = arr.itemsize
    for st, n in dims:
        if st != step:
            return None
        step *= n
    start = arr.__array_interface__["data"][0] + sum(st * (n - 1) for n, st in zip(arr.shape, arr.strides) if st < 0)
    return start, start + arr.nbytes


def has_partial_overlap(written: Any, other: Any, expanded: bool = False) -> bool:
    """``written`` and ``other`` share some memory but are not the same elements in the same layout (torch's
    PARTIAL overlap: ``t[1:].add_(t[:-1])`` is refused, ``t.add_(t)`` is not). As torch, only arrays whose
    elements fill their bytes densely are compared; others are too costly to prove and pass. ``expanded``:
    ``other`` is a value broadcast to ``written``'s shape, as torch's setitem expands it first."""
    a, b = _dense_span(written), _dense_span(other)
    if a is None or b is None or a[1] <= b[0] or b[1] <= a[0]:
        return False
    if expanded:  # ``other`` broadcast to ``written``'s shape (setitem): dimensions of one element aside
        return not (a == b and _layout(written) == _layout(other))
    return not (a == b and written.strides == other.strides and written.shape == other.shape)


def _layout(arr: Any) -> Tuple[Tuple[int, int], ...]:
    """Size and stride of each dimension of more than one element: ``x[None] = x`` writes the same
    elements laid out alike (torch allows it; ``x.unsqueeze(0).add_(x)`` it refuses)."""
    return tuple((n, st) for n, st in zip(arr.shape, arr.strides) if n > 1)


def write_refusal(t: Any, who: str, index: int, recording: bool, how: str = "MarkDirty") -> Optional[BaseException]:
    """Why the op ``who`` may not write its argument ``index`` (the runtime Tensor ``t``) in place, as the
    exception to raise, or None when it may. ``recording``: grad mode is on and the call records a node;
    ``how``: what declared the write (``MarkDirty``, ``mark_dirty``), for the message."""
    if has_internal_overlap(t._data):
        return RuntimeError(f"{who} modifies argument {index} in place ({how}): {OVERLAP_MESSAGE}")
    if t._view_no_grad and _state.enabled and no_grad_view_refused(t):  # grad mode on, recorded or not
        return RuntimeError(f"{who} modifies argument {index} in place ({how}): {NO_GRAD_VIEW_WRITE}")
    if not recording:
        return None
    if t.requires_grad and t._node is None:
        return RuntimeError(f"{who} modifies argument {index} in place ({how}), but it is a leaf that "
                            f"requires grad; in-place changes of such leaves are not allowed "
                            f"(use a copy, e.g. x * 1)")
    ref = t._base_ref
    base = None if ref is None else ref()
    if base is not None and base.requires_grad and base._node is None:
        return RuntimeError(f"{who} modifies argument {index} in place ({how}), but it is a view of a leaf "
                            f"that requires grad; in-place changes of such views are not allowed "
                            f"(use a copy, e.g. x * 1)")
    return None


LEAF_REFUSAL_MARKS = (", but it is a leaf that requires grad;", ", but it is a view of a leaf that requires grad;")


def is_leaf_write_refusal(err: BaseException) -> bool:
    """``err`` is the refusal of a write into a leaf that requires grad (or a view of one), in the words
    ``write_refusal`` and the C++ ``Refusal`` (include/opbuilder/detail/call_rules.h) give it. Such a
    refusal wrote nothing, so a caller that can hand the op a copy instead may run it again."""
    msg = str(err)
    return isinstance(err, RuntimeError) and " in place (" in msg and any(m in msg for m in LEAF_REFUSAL_MARKS)


def check_writable(t: Any, who: str, index: int = 0, recording: bool = True, how: str = "MarkDirty") -> None:
    """Raise ``write_refusal``'s error, if any: call it before the write."""
    err = write_refusal(t, who, index, recording, how)
    if err is not None:
        raise err


class Protected:
    """The inputs that must not change (those a write would be refused for), with their values
    before Forward: ``restore`` puts back any that changed, so a refusal leaves data untouched."""

    __slots__ = ("items",)

    def __init__(self, items: List[Tuple[int, Any, Any, BaseException]]) -> None:
        self.items = items  # (argument index, the array Forward may write, its copy, the refusal)

    def refusal(self, index: int) -> Optional[BaseException]:
        """The refusal decided for argument ``index`` before Forward, or None."""
        for i, _, _, err in self.items:
            if i == index:
                return err
        return None

    def changed(self, index: int) -> bool:
        """Argument ``index`` is protected and its values differ from before Forward."""
        for i, arr, copy, _ in self.items:
            if i == index:
                return not _same_bytes(arr, copy)
        return False

    def restore(self) -> None:
        """Every protected argument back to its values before Forward."""
        for _, arr, copy, _ in self.items:
            if not _same_bytes(arr, copy):
                _write_back(arr, copy)


def _same_bytes(arr: Any, copy: Any) -> bool:
    if type(arr) is np.ndarray:
        if arr.flags.c_contiguous and arr.dtype.itemsize:  # compared as bytes, without copying
            return bool(np.array_equal(arr.reshape(-1).view(np.uint8), copy.reshape(-1).view(np.uint8)))
        return arr.tobytes() == copy.tobytes()
    return arr.get().tobytes() == copy.get().tobytes()  # CuPy: compared on the host


def _write_back(arr: Any, copy: Any) -> None:
    if type(arr) is np.ndarray and not arr.flags.writeable:  # a write that should never have happened
        arr = np.lib.stride_tricks.as_strided(arr, writeable=True)  # (read-only memory that Forward wrote)
    arr[...] = copy


def protect(args: Sequence[Any], who: str, recording: bool, how: str = "MarkDirty") -> Optional[Protected]:
    """Decide, before Forward runs, which Tensor arguments of ``who`` a write would be refused for, and keep
    their values (None when there is none: the common call pays one check per argument)."""
    from .tensor import Tensor
    items = None
    for i, a in enumerate(args):
        if not isinstance(a, Tensor):
            continue
        err = write_refusal(a, who, i, recording, how)
        if err is not None:
            if items is None:
                items = []
            items.append((i, a._data, a._data.copy(), err))
    return None if items is None else Protected(items)


# The class attribute (in the class's own __dict__, never inherited) of a Python Function subclass that
# says what its calls showed: absent, nothing yet; False, a recorded call completed without writing an
# input; True, a call wrote one. ``protect`` is called unless it is False (include/opbuilder/detail/
# call_rules.h WriteKnowledge is the C++ Function<T>'s).
WRITES_ATTR = "_opbuilder_writes_inputs"


def note_writes(cls: type) -> None:
    """A call of the operator class ``cls`` wrote an input (``mark_dirty``, or a write found without it):
    its calls protect their inputs from now on."""
    if cls.__dict__.get(WRITES_ATTR) is not True:
        setattr(cls, WRITES_ATTR, True)


def note_read_only_call(cls: type) -> None:
    """A recorded call of ``cls`` completed without writing an input: unless one of its calls wrote
    (or writes later), its calls protect nothing."""
    if WRITES_ATTR not in cls.__dict__:
        setattr(cls, WRITES_ATTR, False)


def share_alias(out: Any, arg: Any) -> None:
    """``out`` is a new Tensor over the memory of the argument ``arg`` (returned unchanged by an operator):
    it is a view of ``arg``, as torch makes a custom Function's output that is its input (``view_as``).
    They count writes on one version counter, and ``out``'s ``_base_ref`` is ``arg``'s base (or ``arg``),
    so ``write_refusal``'s view rules apply to it: a write into an alias of a leaf that requires grad is
    refused before Forward runs, and a write into an alias of a non-leaf rebases that tensor's history.
    Under no_grad it is a plain alias (a write through it is not refused, even with grad on later), as
    torch's custom Function's output is: torch marks no view there (unlike its own view ops, whose view of
    a view made under no_grad is refused: primitive.py). Call it before ``out``'s history is set."""
    share_version(out, arg)
    if not _state.enabled:
        return
    ref = arg._base_ref  # a view of a view: the first tensor of the chain, while it lives
    if ref is None or ref() is None:
        ref = weakref.ref(arg)
    out._base_ref = ref
    out._view_version = out._vc.value  # its history (set next) is current at this version
    out._view_no_grad = arg._view_no_grad  # an alias of a no_grad view is one too


class _ArgumentView(ViewOfBase):
    """The node of a view of an argument a module function returned (``returned_view``): the argument's
    gradient is the view's, placed where its elements sit in it (ViewOfBase), summed where they repeat.
    Where they sit is kept as an offset and strides in the argument's C-order elements, the positions made
    when the backward runs, in the view's size; or, for an argument of another layout, as their indices."""

    __slots__ = ("where",)
    name = "a view of its argument a module function returned"

    def __init__(self, edge: Any, where: Any, arg_meta: Any, view_meta: Any, repeats: bool) -> None:
        super().__init__(edge, None, arg_meta, view_meta, repeats)
        self.where = where

    def positions(self) -> np.ndarray:
        if type(self.where) is tuple:
            offset, strides = self.where
            return grid(self.out_meta[0][0], strides, offset)
        return self.where


def _span(arr: Any) -> Tuple[int, int]:
    """The addresses of the first and last bytes of ``arr``'s elements (non-empty)."""
    lo = hi = address(arr)
    for n, st in zip(arr.shape, arr.strides):
        lo, hi = (lo + (n - 1) * st, hi) if st < 0 else (lo, hi + (n - 1) * st)
    return lo, hi + arr.itemsize - 1


def _placement(arr: Any, base: Any) -> Any:
    """Where the elements of ``arr`` sit in ``base``, a C-contiguous array of its dtype: (offset, strides)
    in ``base``'s elements, or None when one is outside ``base`` or off its element grid. In ``arr``'s
    number of dimensions, not its size."""
    item = base.itemsize
    start = address(arr) - address(base)
    if start % item or any(st % item for st in arr.strides) or not _inside(arr, base):
        return None
    return start // item, tuple(st // item for st in arr.strides)


def _inside(arr: Any, base: Any) -> bool:
    """Every byte of ``arr``'s elements is within the extent of ``base``'s (both non-empty)."""
    (alo, ahi), (blo, bhi) = _span(arr), _span(base)
    return blo <= alo and ahi <= bhi


def _may_repeat(arr: Any) -> bool:
    """Two places of ``arr`` may be one element: unless its strides, smallest first, each step past the
    whole extent of the ones before (a broadcast, overlapping windows: True)."""
    dims = sorted((abs(st), n) for n, st in zip(arr.shape, arr.strides) if n > 1)
    reach = 0
    for st, n in dims:
        if st <= reach:
            return True
        reach = st * (n - 1) + reach
    return False


def returned_view(arg: Any, arr: Any) -> Any:
    """A module function returned a Tensor it built over its argument ``arg``'s memory (a slice on
    ``x->storage()``, no Function around it): the runtime Tensor over ``arr`` (that Tensor's memory) as a
    view of ``arg``, as torch's ``x[:2]`` in a Python function is, and as the runtime's own view ops make
    one (``take_view``: its counter, base and write rules). With grad mode on and ``arg`` requiring grad,
    its gradient goes to ``arg``, placed where its elements sit in ``arg``. None where it is no view of
    ``arg``: an element outside ``arg``'s, another dtype (a bit cast), or another framework keeping
    ``arg``'s counter (to_torch's Python path makes its own view of the caller's tensor). Its cost is in
    ``arr``'s dimensions for a C-contiguous ``arg``, not in either's size."""
    from .tensor import Tensor
    from .versions import Version
    base = arg._data
    if type(arg._vc) is not Version or arr.dtype != base.dtype or not arr.size:
        return None
    grad = _state.enabled and arg.requires_grad
    where: Any = None
    if base.flags.c_contiguous:
        where = _placement(arr, base)
        if where is None:
            return None
    elif grad:  # another layout: the indices, in the size of arg
        try:
            where = view_indices(arr, base)
        except RuntimeError:
            return None
    elif not _inside(arr, base):  # (no gradient to place: its memory is arg's, or it is no view)
        return None
    out = Tensor._from_array(arr)
    take_view(out, arg)
    if grad:
        if arg._base_ref is not None and arg._vc.value != arg._view_version:
            refresh_view(arg)  # (its base written since its history was set)
        edge = arg if arg._node is None else (arg._node, arg._out_index)
        out._node = _ArgumentView(edge, where, (base.shape, base.dtype), (arr.shape, arr.dtype), _may_repeat(arr))
        out._out_index = 0
        out.requires_grad = True
    return out


# ---- in-place writes into a view: the base's history is rebased (torch's CopySlices) ------------------------

class _CopySlices(Node):
    """The base's node after an op wrote into one of its views (torch's CopySlices): the base's
    gradient passes unchanged outside the view; inside it, through the op's backward to the view's
    earlier values and the op's other inputs. Edges: the base's earlier history, then the op's own
    edges (the written argument's left out: its gradient went into the view's place)."""

    __slots__ = ("fn", "out_index", "arg_index", "idx", "idx_pairs")
    differentiable = False  # numpy inside: a higher-order gradient through it is a named error

    def __init__(self, fn: Any, out_index: int, arg_index: int, idx: np.ndarray, base_edge: Any,
                 base_meta: Any) -> None:
        self.fn, self.out_index, self.arg_index, self.idx = fn, out_index, arg_index, idx
        self.idx_pairs = base_meta[1].kind == "c" and fn.out_meta[out_index][1].kind != "c"
        edges = list(fn.next_edges)
        edges[arg_index] = None
        self.next_edges = (base_edge, *edges)
        self.input_meta = (base_meta, *fn.input_meta)
        self.out_meta = (base_meta,)

    @property
    def name(self) -> str:
        return f"{self.fn.name} (written into a view)"

    def apply(self, grads: Sequence[Any], create_graph: bool) -> List[Any]:
        from .autograd import engine
        from . import device as _device
        g = grads[0]._data
        xp = np if type(g) is np.ndarray else _device.array_module(g)
        result = xp.array(g, copy=True, order="C")
        flat = result.reshape(-1)
        if self.idx_pairs:  # a real view of a complex base: its elements are the base's real pairs
            flat = pairs(flat)
        fn = self.fn
        buf: List[Any] = [None] * len(fn.out_meta)
        buf[self.out_index] = grad_tensor(take(xp, flat, self.idx))
        _, res = engine._node_backward(fn, buf, True, False)  # released with this node (release)
        gv = res[self.arg_index]
        where = self.idx if xp is np else xp.asarray(self.idx)
        flat[where] = 0 if gv is None else gv._data
        out = [grad_tensor(result)]
        out += [None if k == self.arg_index else r for k, r in enumerate(res)]
        return out

    def release(self) -> None:
        self.fn.release()


def rebase_view(view: Any, arg_index: int) -> None:
    """``view`` (a runtime Tensor with a ``_base``) was written in place by the op whose node is now its
    history (``view._node``, output ``view._out_index``), as that op's argument ``arg_index``. Make the
    base's history the write (its gradient through the op), and the view's history a part of the base,
    as torch does, so a gradient through either sees the write."""
    base = view._base
    fn = view._node
    if base is None or fn is None:
        return
    idx = view_indices(view._data, base._data)
    base_meta = (base._data.shape, base._data.dtype)
    base_edge = None
    if base.requires_grad:
        base_edge = base if base._node is None else (base._node, base._out_index)
    node = _CopySlices(fn, view._out_index, arg_index, idx, base_edge, base_meta)
    base._node, base._out_index, base.requires_grad = node, 0, True
    view._node = ViewOfBase((node, 0), idx, base_meta, (view._data.shape, view._data.dtype),
                            has_internal_overlap(view._data))
    view._out_index = 0
    view._view_version = view._vc.value  # its history is now current (refresh_view)


def refresh_view_arg(view: Any) -> int:
    """``refresh_view`` for native code (include/opbuilder/detail/call_rules.h RefreshViewArg): ``view`` is
    an argument of a C++ ``Function<T>`` call, refreshed while grad mode is on and its version moved.
    Returns 1 if it requires grad now (the C++ Tensor keeps its own copy of that flag), plus 2 if a
    write into it is refused (``no_grad_view_refused``)."""
    if not _state.enabled:
        return 1 if view.requires_grad else 0
    if view._vc.value != view._view_version:
        refresh_view(view)
    return (1 if view.requires_grad else 0) | (2 if no_grad_view_refused(view) else 0)


def no_grad_view_refused(t: Any) -> bool:
    """A write into ``t`` while grad mode is on is refused as torch refuses it: ``t`` is a view made
    under no_grad of a base that requires grad (``NO_GRAD_VIEW_WRITE``)."""
    if not t._view_no_grad:
        return False
    base = t._base_ref()
    return base is not None and base.requires_grad
