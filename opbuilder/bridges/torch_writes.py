"""Writes a ``to_torch`` operator makes into its torch arguments, under torch's rules for in-place ops.

A C++ op may write a tensor argument in place: declared (``MarkDirty``; ``to_torch(..., mutates=)``,
the out= pattern) or not. What torch does for its own in-place ops holds for such a write on every route:

- counting: a runtime tensor over a torch tensor's memory counts its writes on that tensor's version
  counter (``_TorchVersion``), one bump a write, ``ctx.mark_dirty``'s included (``_marked``,
  ``_flush_pending``, ``_once_each``); a declared write bumps it as torch's out= does (``_bump_declared``).
- finding: a signature's first call, and every call of one seen returning nothing or writing unannounced,
  checksums the bytes of each argument (``_watch``), so a write the runtime did not count is found after
  the call (``_after_watch``, ``_unannounced``); a change a marked write explains is none (``_explained``).
- refusing: what torch refuses is refused in its words: a write into a leaf that requires grad
  (``_torch_write_refusal``), into the copy a conjugate or negative view or an inference tensor reached
  the op as (``_refuse_copy_writes``), out= with grad or into an inference tensor (``_refuse_out_grad``,
  ``_refuse_out_inference``).
- history: an argument written and not returned takes the write's history, as after torch's ``x.mul_(3)``
  (``_settle``, ``_rebasing``, ``_Rebase``).

A module of its own so that these rules stand in one place, apart from interop_torch.py (the operators
and their routes), which calls them at fixed points of a call: both build on torch_call.py (the call's
record, the thread's state of the call), and this module never imports interop_torch. An ``op``
argument is interop_torch's ``_Op`` (its name, devices, declared writes, and the signatures it watches
or has checked).
"""
from __future__ import annotations

import weakref
import zlib
from typing import Any, Callable, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from runtime.dlpack_host import inference_write_message as _inference_write_message
from runtime.dlpack_host import resolved_view_write_message as _resolved_view_write_message

from .torch_call import (_PLAIN, _Call, _flat, _from_numpy, _input_grads, _mode, _once, _save_mark,
                         _to_runtime, _view_over)

_increment_version = torch._C._increment_version
_K = torch._C.DispatchKey


# ---- counting: writes on torch's version counters ----

class _TorchVersion:
    """The version counter of a runtime tensor over a torch tensor's memory: torch's own. Reads give
    the torch tensor's ``_version``; a runtime write (MarkDirty, a write through a view) bumps it with
    ``torch.autograd.graph.increment_version``. So the runtime's checks of the tensors an op saved see
    torch's in-place writes, and torch's checks see the op's (torch's rule: one counter per memory)."""
    __slots__ = ("t", "off", "written", "pending", "copy", "owner")

    def __init__(self, t: torch.Tensor, value: Optional[int] = None, copy: bool = False,
                 owner: Optional["weakref.ref[torch.Tensor]"] = None) -> None:
        self.t = t  # a detached alias: it shares the counter, not the autograd history
        # the caller's tensor itself (weakly: no cycle through its history), whose counter this is, where the
        # detached alias may have one of its own (made below torch's ADInplaceOrView, as under a dispatch
        # mode: _run_registered); None: t's counter is the tensor's
        self.owner = owner
        self.off = 0 if value is None else value - self.counter()._version
        self.written = False
        self.pending = 0  # writes counted here only, while a torch Function will bump torch's (``_Eager``)
        # the op got a resolved copy (a conjugate or negative view): its writes never reach the tensor, and
        # are refused (record), so they are counted here only
        self.copy = copy

    def counter(self) -> torch.Tensor:
        """The tensor whose version counter this is."""
        if self.owner is not None:
            o = self.owner()
            if o is not None:
                return o
        return self.t

    @property
    def value(self) -> int:
        return self.counter()._version + self.off

    @value.setter
    def value(self, v: int) -> None:
        n = v - self.counter()._version - self.off
        if n > 0:
            self.written = True
            if self.copy:
                self.off += n
                return
            if getattr(_mode, "defer", False):  # ctx.mark_dirty will bump torch's counter: once, not twice
                self.off += n
                self.pending += n
                return
            for _ in range(n):
                _increment_version((self.counter(),))
        else:
            self.off += n


def _flush_pending(vcs: Sequence[Any]) -> None:
    """Writes counted only in ``_TorchVersion.pending`` (``_Eager``'s forward defers them to
    ``ctx.mark_dirty``) go to torch's counters: a call that raised marks nothing, but what it wrote
    (an undeclared write the runtime found after Forward) changed the tensor."""
    for vc in vcs:
        if type(vc) is _TorchVersion and vc.pending:
            vc.off -= vc.pending
            for _ in range(vc.pending):
                _increment_version((vc.counter(),))
            vc.pending = 0


def _marked(call: _Call) -> None:
    """torch bumps the version of what ``ctx.mark_dirty`` names once (after the forward), for the write the
    runtime counted already: the runtime's view of those counters stays one write (what the op saved still
    checks). A write counted only here (``_TorchVersion.pending``) and not marked goes to torch's counter."""
    done: set = set()  # (one tensor at two positions: one counter, one write)
    for k in sorted(call.dirty):
        vc = call.vcs[k]
        if vc is None or id(vc) in done:
            continue
        done.add(id(vc))
        if k in call.alias or k in call.written:  # torch's mark_dirty bumps it once (the node's, or _Rebase's):
            n = max(vc.pending, 1)                 # the writes before the last go to torch's counter here,
            for _ in range(n - 1):                 # so it counts each, as torch's own in-place ops do
                _increment_version((vc.counter(),))
            vc.off -= n
            vc.pending = 0
        else:
            _flush_pending((vc,))


def _once_each(tensors: Iterable[torch.Tensor]) -> List[torch.Tensor]:
    """Each tensor once, in order: torch's mark_dirty bumps a counter once per tensor it is given, and an op
    that returns its dirty argument twice wrote it once (the C++ bridge counts one; this path counted two)."""
    out: List[torch.Tensor] = []
    for t in tensors:
        if not any(t is u for u in out):
            out.append(t)
    return out


def _bump_declared(op: Any, sig: str, args: Sequence[Any], vcs: Sequence[Any]) -> None:
    """One write on the version counter of each declared written argument the op did not mark dirty
    (torch's out= bumps it): what saved it sees the write."""
    flat = 0
    for k, (a, c) in enumerate(zip(args, sig)):
        if c == "t":
            vc = vcs[flat]
            if k in op.writes and vc is not None and not vc.written:
                _increment_version((vc.counter(),))
            flat += 1
        elif c == "L":
            flat += len(a)


# ---- finding: writes the runtime did not count (fingerprints) ----

class _Uncounted:
    """An inference tensor's stand-in for a ``_TorchVersion`` in a watched call (``_watch``): its bytes are
    checksummed, and no write is ever counted on it (it has no counter)."""
    __slots__ = ("t",)
    written = False

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t


def _bytes_of(t: torch.Tensor) -> np.ndarray:
    """The memory of a CPU tensor as numpy sees it (bfloat16 as uint16), for a fingerprint."""
    return (t.view(torch.uint16) if t.dtype == torch.bfloat16 else t).numpy()


def _digest(arr: np.ndarray) -> int:
    """A checksum of every byte of ``arr``: a write anywhere in it changes it (but for a 2**-32 chance),
    where a sample of its elements would miss a sparse write. Watched calls only (first calls, out=)."""
    return zlib.crc32(arr if arr.flags.c_contiguous else np.ascontiguousarray(arr))


def _watch(vc: Any, r: Any) -> Optional[Tuple[Any, int, np.ndarray]]:
    """An argument's counter (a ``_TorchVersion``, or an inference tensor's ``_Uncounted``), checksum and
    the memory checksummed, before a watched call: the torch tensor's, or for a conjugate or negative view
    the resolved copy the op gets (``r``, its runtime tensor), whose write would not reach the caller.
    None where no write can be seen (memory off the CPU, a dtype numpy cannot view)."""
    if vc is None or not vc.t.is_cpu or (vc.t.dtype not in _PLAIN and vc.t.dtype != torch.bfloat16):
        return None
    arr = r._data if vc.t.is_conj() or vc.t.is_neg() else _bytes_of(vc.t)
    if not isinstance(arr, np.ndarray):
        return None
    return vc, _digest(arr), arr


def _snapshot_shared(watch: List[Any]) -> List[Any]:
    """Each watched argument whose bytes meet another's (and is not the same elements) with a copy of its
    values before the call, so that ``_explained`` can tell which of its bytes changed. (Bytes, not
    storages: two torch tensors from_numpy over one array have storages of their own.)"""
    spans = [_byte_span(w[0].t) if w is not None and w[0].t.numel() and not (w[0].t.is_conj() or w[0].t.is_neg())
             else None for w in watch]
    for k, w in enumerate(watch):
        if spans[k] is not None and any(j != k and spans[j] is not None and spans[j][0] < spans[k][1]
                                        and spans[k][0] < spans[j][1] and not _same_elements(watch[j][0].t, w[0].t)
                                        for j in range(len(watch))):
            watch[k] = (*w, w[2].copy())
    return watch


def _explained(watch: Sequence[Any], k: int) -> bool:
    """Whether a counted write explains a change of watched argument ``k``: another argument the op marked
    dirty is the same elements of the same memory (one torch tensor passed twice, as in torch's
    ``x.add_(x)``), or every byte of ``k`` that changed is a byte of an argument the op marked dirty
    (``f(base, base[1:])`` writing the view, of any dtype, which torch allows). No other change is."""
    t = watch[k][0].t
    written = [w[0].t for j, w in enumerate(watch) if j != k and w is not None and w[0].written]
    if any(_same_elements(x, t) for x in written):
        return True
    if len(watch[k]) < 4:  # (no copy: it shares no memory with another argument)
        return False
    old, new = watch[k][3], watch[k][2]
    item = old.dtype.itemsize
    changed = (np.ascontiguousarray(old).view(np.uint8).reshape(old.shape + (item,)) !=
               np.ascontiguousarray(new).view(np.uint8).reshape(new.shape + (item,)))
    # a mask of the storage's bytes from k's first to its last: those of the written arguments set
    lo, hi = _byte_span(t)
    mask = np.zeros(hi - lo, dtype=np.bool_)
    for x in written:
        if x.numel() == 0:
            continue
        xlo, xhi = _byte_span(x)
        a, b = max(xlo, lo), min(xhi, hi)
        if a >= b:
            continue
        if xlo >= lo and xhi <= hi:
            _byte_grid(mask, x, xlo - lo)[...] = True
        else:  # (sticks out of k's span: set it in a mask of its own, then take the overlap)
            own = np.zeros(xhi - xlo, dtype=np.bool_)
            _byte_grid(own, x, 0)[...] = True
            mask[a - lo:b - lo] |= own[a - xlo:b - xlo]
    return not bool((changed & ~_byte_grid(mask, t, 0)).any())


def _byte_span(t: torch.Tensor) -> Tuple[int, int]:
    """The addresses [first, last + 1) of a CPU tensor's bytes (its elements' first to its last's end)."""
    lo = hi = 0
    for n, st in zip(t.shape, t.stride()):
        lo += min(0, st * (n - 1))
        hi += max(0, st * (n - 1))
    item = t.element_size()
    return t.data_ptr() + lo * item, t.data_ptr() + (hi + 1) * item


def _byte_grid(mask: np.ndarray, t: torch.Tensor, at: int) -> np.ndarray:
    """A view of ``mask`` (one entry per byte, ``t``'s lowest byte at ``at``) in ``t``'s shape and
    element size: entry [i..., b] is byte b of element [i...]."""
    item = t.element_size()
    lo = sum(min(0, st * (n - 1)) for n, st in zip(t.shape, t.stride())) * item
    return np.lib.stride_tricks.as_strided(mask[at - lo:], tuple(t.shape) + (item,),
                                           tuple(st * item for st in t.stride()) + (1,))


def _same_elements(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors are the same elements of the same memory (layout, offset and dtype)."""
    return (a.data_ptr() == b.data_ptr() and a.dtype == b.dtype and a.shape == b.shape
            and a.stride() == b.stride())


def _unseen(args: Sequence[Any], sig: str) -> bool:
    """Whether a write into some CPU tensor argument of this call cannot be seen by its checksum: one with
    no element. A later call of the signature may show what this one could not."""
    for t in _flat(args, sig):
        if t.is_cpu and t.numel() == 0:
            return True
    return False


def _after_watch(op: Any, sig: str, args: Sequence[Any], watch: Sequence[Any], void: bool) -> None:
    """After a fingerprinted call: its undeclared writes counted (``_unannounced``), and the signature
    watched from now on (it returned nothing, or wrote an argument unseen) or else checked (later calls,
    the C++ bridge's included, skip the fingerprints)."""
    if void or _wrote(watch):
        op.watched.add(sig)
        op.checked.pop(sig, None)
        _unannounced(op, sig, args, watch)
    elif sig not in op.watched and not _unseen(args, sig):
        op.checked[sig] = True  # (a call whose writes could not be seen proves nothing: the next is watched)


def _wrote(watch: Sequence[Any]) -> bool:
    """Whether the call wrote a watched argument without the runtime counting it (MarkDirty)."""
    for k, w in enumerate(watch):
        if w is not None and not w[0].written and _digest(w[2]) != w[1] and not _explained(watch, k):
            return True
    return False


def _unannounced(op: Any, sig: str, args: Sequence[Any], watch: Sequence[Any], raised: bool = False) -> None:
    """After a watched call: each tensor argument it wrote (not declared in ``mutates``, not marked dirty)
    counts one write on its version counter, as torch's out= does; one that requires grad is an error
    (torch refuses out= into it before the call; undeclared, the write is only seen after). ``raised``:
    the call raised (its error is the one raised, and a write into a copy it got is nothing): the writes
    count, as after torch's own in-place op that fails midway, and the signature is watched from now."""
    flat = [t for a, c in zip(args, sig) if c in "tL" for t in ([a] if c == "t" else a)]
    for k, (t, w) in enumerate(zip(flat, watch)):
        if w is None or w[0].written or _digest(w[2]) == w[1] or _explained(watch, k):
            continue
        if raised:
            op.watched.add(sig)
            op.checked.pop(sig, None)
        if w[0].t.is_neg() or w[0].t.is_conj():  # the op wrote the resolved copy it got
            if raised:
                continue
            raise RuntimeError(_resolved_view_write_message(op.name, k, w[0].t, "an undeclared write"))
        if t.is_inference() and not w[0].t.is_inference():  # the op wrote the copy it got
            if raised:
                continue
            raise RuntimeError(_inference_write_message(op.name, k, "an undeclared write"))
        if not w[0].t.is_inference():  # (which has no counter)
            _increment_version((w[0].counter(),))
        if not raised and t.requires_grad and getattr(_mode, "grad", True):
            raise RuntimeError(
                f"{op.name}() wrote tensor argument {k} in place, which requires grad; functions with "
                f"out=... arguments don't support automatic differentiation. Its data has already changed: "
                f"declare the write (to_torch(..., mutates={{{op.name!r}: [positions]}})) so such a call is "
                f"refused before it runs, and call it under torch.no_grad() or on tensors that do not "
                f"require grad")


# ---- refusing: writes torch would not allow ----

def _torch_write_refusal(err: RuntimeError, args: Sequence[Any]) -> RuntimeError:
    """The runtime refused a write (MarkDirty) into a leaf that requires grad, or a view of one: torch's
    own refusal of that torch argument, in torch's words, as the C++ bridge gives it (``Op: <torch's
    check_inplace message>``). torch's check runs in an in-place copy whose source cannot broadcast, so
    it writes nothing whether or not torch refuses; the runtime's error stays when torch would not."""
    msg = str(err)
    who, _, rest = msg.partition(" modifies argument ")
    index = rest.split(" ", 1)[0]
    flat = [t for a in args for t in (a if isinstance(a, (list, tuple)) else (a,)) if isinstance(t, torch.Tensor)]
    if index.isdigit() and int(index) < len(args) and isinstance(args[int(index)], torch.Tensor):
        flat.insert(0, args[int(index)])  # the argument it names, first
    for t in flat:
        if not (t.requires_grad or t._is_view()):
            continue
        try:  # with autograd's dispatch back on: inside a registered kernel torch excludes it
            with torch.enable_grad(), torch._C._SetExcludeDispatchKeyGuard(_K.AutogradFunctionality, False), \
                    torch._C._SetExcludeDispatchKeyGuard(_K.AutogradOther, False):
                t.copy_(torch.empty((2,) * (t.dim() + 1), dtype=t.dtype, device=t.device))
        except RuntimeError as e:
            words = str(e)
            if "in-place" in words or "inplace" in words:
                return RuntimeError(f"{who}: {words}")
    return err


def _copy_args(args: Sequence[Any], sig: str, vcs: Sequence[Any]) -> set:
    """The flat positions whose tensor reached the op as a copy (a conjugate or negative view resolved,
    an inference tensor outside InferenceMode cloned): a write there never reaches the caller's tensor."""
    out = set()
    flat = None
    for i, v in enumerate(vcs):
        if v is None or not v.written:
            continue
        if v.copy:
            out.add(i)
            continue
        flat = _flat(args, sig) if flat is None else flat
        if not v.t.is_inference() and flat[i].is_inference():
            out.add(i)
    return out


def _refuse_copy_writes(op: Any, sig: str, args: Sequence[Any], dirty: Sequence[int], vcs: Sequence[Any],
                        rebase: Optional[Tuple[Any, ...]] = None) -> None:
    """A conjugate or negative view, or an inference tensor outside InferenceMode, reached the op as a
    copy: its write is refused, the caller's tensor untouched (the error carries ``rebase``: what the
    call wrote into other arguments)."""
    for i in dirty:
        t = vcs[i].t
        if t.is_neg() or t.is_conj():
            err = RuntimeError(_resolved_view_write_message(op.name, i, t))
        elif not t.is_inference() and _flat(args, sig)[i].is_inference():
            err = RuntimeError(_inference_write_message(op.name, i))
        else:
            continue
        err._ob_rebase = rebase  # type: ignore[attr-defined]
        raise err


def _refuse_out_inference(op: Any, sig: str, args: Sequence[Any]) -> None:
    """torch's rule for an inference tensor: no in-place update outside InferenceMode (a declared write)."""
    if torch.is_inference_mode_enabled():
        return
    for k in op.writes:
        if k < len(sig) and sig[k] == "t" and args[k].is_inference():
            raise RuntimeError(_inference_write_message(op.name, k, "declared in mutates"))


def _refuse_out_grad(op: Any, sig: str, args: Sequence[Any]) -> None:
    """torch's rule for out= functions: none while an argument requires grad (grad mode on)."""
    for a, c in zip(args, sig):
        if any(t.requires_grad for t in ([a] if c == "t" else a if c == "L" else ())):
            raise RuntimeError(
                f"{op.name}(): functions with out=... arguments don't support automatic differentiation, "
                f"but one of the arguments requires grad (it writes argument(s) {list(op.writes)}, declared in "
                f"mutates); call it under torch.no_grad() or on tensors that do not require grad")


# ---- history: a written argument's history becomes the write's ----

def _settle(op: Any, sig: str, rt_args: list, args: Sequence[Any], need: list, index: list, vcs: list,
            plain: bool) -> Optional[Tuple[Any, ...]]:
    """A call with no output to mark dirty (a ``plain`` result: None, a number; or one that raised): the
    writes its inner Functions counted go to torch's counters now, or, for an argument whose history a
    recorded write made (counts deferred to a mark_dirty: ``_Eager``, the registered kernel), to
    ``_rebase``'s. ``_rebase``'s arguments for the caller (``_eager``, ``_run_registered``, carried on
    the exception), or None. A plain call that wrote a copy it got (of a conjugate or negative view, of
    an inference tensor) is refused, as one with a tensor result is, the other writes settled first."""
    got_copy = _copy_args(args, sig, vcs)
    dirty = [i for i, v in enumerate(vcs) if v is not None and v.written and i not in got_copy]
    copies = [i for i, v in enumerate(vcs) if v is not None and v.written and i in got_copy]
    if not dirty and not copies:
        return None
    written = None
    if need and dirty and getattr(_mode, "defer", False):
        flat_rt = _flat(rt_args, sig)
        written = {i: flat_rt[i] for i in dirty if flat_rt[i].requires_grad}
    call = _Call(need, index, [], [], dirty, bool(need), len(vcs), vcs, written)
    _marked(call)
    rebase = (op, sig, args, call) if call.written else None
    if plain:
        _refuse_copy_writes(op, sig, args, copies, vcs, rebase)
    return rebase


def _undirtied(args: Sequence[Any], sig: str, dirty: frozenset) -> Sequence[Any]:
    """The arguments a call's torch node keeps for ``_once`` (the edges of its double-backward error):
    all of them, or, when the op wrote some in place (their history is now this node: keeping them would
    be a reference cycle), the others."""
    if not dirty:
        return args
    out: list = []
    k = 0
    for a, c in zip(args, sig):
        if c == "t":
            out.append(None if k in dirty else a)
            k += 1
        elif c == "L":
            out.append([t for j, t in enumerate(a, k) if j not in dirty])
            k += len(a)
        else:
            out.append(a)
    return out


def _rebasing(call: Callable[..., Any], *a: Any) -> Any:
    """``call(*a)`` (a node's apply, the registered operator), then ``_rebase`` for the arguments it wrote
    and did not return: left in ``_mode.written``, or on its exception (``_rebase_raised``: it raised, or
    returned a plain value)."""
    _mode.written = None
    try:
        out = call(*a)
    except BaseException as e:
        _rebase_raised(e)
        raise
    written, _mode.written = _mode.written, None
    if written is not None:
        _, sig, args, done = written
        if done.written:
            _rebase(*written)
        if done.late or done.asis:
            out = _returned_arguments(out, _flat(args, sig), done)
    return out


def _returned_arguments(out: Sequence[Any], flat: Sequence[torch.Tensor], call: _Call) -> Any:
    """The call's outputs with each argument it returned as the caller's tensor itself, as torch's
    ``return x``: a view it wrote (``late``; its history the write's now), or one returned as it came
    (``asis``; a view made inside the call's torch Function would lose the argument's history under
    no_grad, its counter under a dispatch mode, and torch refuses it once its base is written); a Tensor
    the function built over an argument's memory as torch's view of it, made here likewise."""
    got = list(out)
    for j, k in enumerate(call.alias):
        if k in call.late:
            got[j] = flat[k]
    for j, k, arr in call.asis:
        got[j] = flat[k] if arr is None else _argument_view(flat[k], arr)
    return tuple(got) if isinstance(out, tuple) else got


def _argument_view(t: torch.Tensor, arr: np.ndarray) -> torch.Tensor:
    """A module function's Tensor over ``t``'s memory (built on x->storage()) as torch's view of ``t``: ``t``
    itself over exactly its elements (as the bridge gives it: the C++ side cannot tell the two apart), else
    ``_view_over`` (torch's x[:2], its counter and base), or the runtime array as a tensor of its own where
    there is none."""
    item = arr.itemsize
    if (arr.__array_interface__["data"][0] == t.data_ptr() and arr.shape == tuple(t.shape)
            and all(n == 1 or a == b * item for n, a, b in zip(arr.shape, arr.strides, t.stride()))):
        return t
    view = _view_over(t, arr)
    return view if view is not None else _from_numpy(arr)


def _rebase_raised(e: BaseException) -> None:
    """The ``_rebase`` a call that raised (``record``: ``_settle``) left on its exception, done once."""
    rebase = getattr(e, "_ob_rebase", None)
    if rebase is not None:
        del e._ob_rebase  # type: ignore[attr-defined]
        try:
            _rebase(*rebase)
        except Exception as err:  # the call's own error is the one raised
            e.add_note(f"(to_torch could not give the arguments it wrote their new history: {err})")


def _rebase(op: Any, sig: str, args: Sequence[Any], call: _Call) -> None:
    """torch's rule for an in-place write, for arguments the call wrote (an inner Function's MarkDirty) and
    did not return: their history becomes the write's (``_Rebase``), so a use after the call differentiates
    through it. The C++ bridge gets this with a torch node per Function; this path has one node per call."""
    flat = _flat(args, sig)
    ks: List[int] = []
    # one tensor at two positions: marked once, a late one (returned) at its own position
    for k in sorted(call.written, key=lambda k: (k not in call.late, k)):
        if not any(flat[k] is flat[j] for j in ks):
            ks.append(k)
    with torch.enable_grad():
        if len(ks) > 1 and any(flat[k]._is_view() for k in ks):
            # torch lets a node that writes a view return nothing else: a node per written argument, each
            # given the others as they were before any write (aliases made first keep that history)
            olds = [_Alias.apply(t) if t.requires_grad else t for t in flat]
            for k in ks:
                order = [k] + [i for i in range(len(flat)) if i != k]
                _Rebase.apply(op, call, tuple(order), 1, flat[k], *[olds[i] for i in order[1:]])
            return
        # a written view first: torch's CopySlices takes the node's first input for the view's old value
        ks.sort(key=lambda k: not flat[k]._is_view())
        order = ks + [i for i in range(len(flat)) if i not in ks]
        _Rebase.apply(op, call, tuple(order), len(ks), *[flat[i] for i in order])


class _Alias(torch.autograd.Function):
    """A tensor over ``t``'s memory whose history is ``t``'s as it is now: a later in-place write into
    ``t`` (another _Rebase) leaves it as it was."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor) -> torch.Tensor:
        return t.detach()

    @staticmethod
    def backward(ctx: Any, g: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        return g


class _Rebase(torch.autograd.Function):
    """The written arguments as the outputs of one node, marked dirty (its inputs: the call's flat tensors
    in ``order``, the ``n`` written ones first): its backward takes their gradients through the call's
    runtime graph (from the runtime tensors the writes made) to every tensor input of the call."""

    @staticmethod
    def forward(ctx: Any, op: Any, call: _Call, order: Tuple[int, ...], n: int,
                *tensors: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        written = tensors[:n]
        ctx.mark_dirty(*written)
        ctx.op, ctx.call, ctx.order, ctx.n = op, call, order, n
        _save_mark(ctx)  # torch's rule for a second backward
        return tuple(written)

    @staticmethod
    def backward(ctx: Any, *grads: Optional[torch.Tensor]) -> Tuple[Any, ...]:
        ctx.saved_tensors  # raises torch's error on a second backward without retain_graph
        call, op, order = ctx.call, ctx.op, ctx.order
        pairs = [(call.written[k], _to_runtime(op.name, k, g, op.devices)) for k, g in zip(order, grads)
                 if g is not None]
        res = _input_grads(call, pairs, True)
        out = _once(op.name, [res[i] for i in order], grads, any(ctx.needs_input_grad[4:]))
        return (None, None, None, None) + tuple(out)
