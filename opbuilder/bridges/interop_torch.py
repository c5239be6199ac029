"""``to_torch(module)``: an operator module's functions as PyTorch operators.

Each function becomes a ``torch.library`` operator (one per call signature,
defined on first use: tensors and plain ints, floats, bools, strings and lists
have fixed schema types). Tensors cross without copies both ways: torch ->
runtime through ``Tensor.numpy()`` (DLPack off the CPU), runtime -> torch through
``torch.from_numpy`` on the buffer the kernel wrote; bfloat16 crosses both ways as a uint16 view
(numpy has no bfloat16 of its own). Eager calls that no mode
or tensor subclass must see skip torch.library's Python layers and call the
same kernels directly (through a ``torch.autograd.Function`` when recording
grad). Autograd: the forward runs once through the runtime
with the inputs that require grad marked; torch's node for the call holds the
runtime graph, and torch's backward runs the runtime backward on it (the C++
``Backward``). Where no graph was kept (a compiled graph), the backward op
recomputes the forward with grad recording. Importing this module imports
torch; nothing else in opbuilder does (torch._dynamo only once something is compiled).

One semantics with torch's own operators (runtime/call_rules.py decides the rules):
each runtime tensor over a torch tensor's memory counts writes on that tensor's
version counter (``_TorchVersion``), so the runtime's saved-tensor checks see
torch's in-place writes, and MarkDirty bumps the counter torch sees; an output
that is an argument returned unchanged comes back as that argument (a view of
it, or the argument itself when written: torch's in-place rule); a gradient of
a gradient is one named error; several outputs come back as a tuple.

This module is the operators and their routes. The writes a call makes into its torch arguments
(counted, found, refused, given their history) are torch_writes.py's; what both use (a call's record,
the thread's state of the call in progress, tensors crossing both ways) is torch_call.py's.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import itertools
import sys
import threading
import types
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.autograd.forward_ad as _forward_ad
from torch.utils._python_dispatch import _get_current_dispatch_mode as _current_mode

import runtime as _rt
from runtime import dtypes as _dtypes
from runtime import call_rules as _rules
from runtime.autograd.grad_mode import _state as _rt_grad
from runtime.autograd.node import Node as _Node
from runtime.autograd.saved_hooks import saved_tensors_hooks as _rt_saved_hooks
from runtime.jit.signature import exact_key as _exact_key
from runtime.tensor import Tensor as _Tensor
from runtime.versions import UNWRITTEN as _UNWRITTEN

from . import torch_bridge as _torch_bridge
from .interop_common import Spec, as_specs, check_shape_fns, companion_shape_fns, module_functions, plain_static
from .torch_call import (_PLAIN, _TORCH_DT, _Call, _flat, _from_numpy, _input_grads, _is_compiling, _mode, _once,
                         _save_mark, _to_runtime, _to_torch, _top_hooks, _transforms_active, _view_over)
from .torch_writes import (_TorchVersion, _Uncounted, _after_watch, _bump_declared, _copy_args, _flush_pending,
                           _marked, _once_each, _rebasing, _returned_arguments, _refuse_copy_writes, _refuse_out_grad,
                           _refuse_out_inference, _settle, _snapshot_shared, _torch_write_refusal, _unannounced,
                           _undirtied, _watch)

__all__ = ["to_torch", "op_handle", "TorchOps"]

# one letter per argument kind: "n" is None (an optional tensor left out: std::optional<TensorPtr>), "e" an
# empty list (its element type unknown: int[] takes [], and the function gets [] whatever it declares)
_SCHEMA = {"t": "Tensor", "b": "bool", "i": "int", "f": "float", "s": "str", "I": "int[]", "F": "float[]",
           "L": "Tensor[]", "n": "Tensor?", "e": "int[]"}
_namespaces = itertools.count()
_function_mode = torch._C._is_torch_function_mode_enabled
_grad_enabled = torch.is_grad_enabled
_functorch = torch._C._functorch
_is_wrapped = _functorch.is_functorch_wrapped_tensor
_dynamo_compiling = torch.compiler.is_dynamo_compiling  # one frame less; dynamo reads it as True
_define_lock = threading.RLock()


def _any_requires_grad(args: Sequence[Any], tpos: Tuple[int, ...]) -> bool:
    """Whether a tensor argument requires grad (a function: a generator in the caller would make
    ``args`` a cell on every call)."""
    for i in tpos:
        if args[i].requires_grad:
            return True
    return False


def _fresh(base: np.ndarray, conv: List[Any], tpos: Tuple[int, ...]) -> bool:
    """Whether ``base`` is none of the argument arrays ``conv[i]`` (a helper, not a generator inside
    ``forward_direct``: a generator there would make its locals cells on every call)."""
    for i in tpos:
        if base is conv[i]:
            return False
    return True


class _TorchHistory(_Node):
    """A torch non-leaf's history as the runtime sees it: the argument's node, which passes its gradient
    unchanged to the runtime leaf standing for the torch tensor. So the op may write the argument in
    place (MarkDirty), as torch allows for a non-leaf; a leaf that requires grad stays a leaf (refused)."""
    __slots__ = ()
    name = "torch history"

    def __init__(self, leaf: Any) -> None:
        self.next_edges = (leaf,)
        self.input_meta = self.out_meta = ((leaf._data.shape, leaf._data.dtype),)

    def apply(self, grads: Sequence[Any], create_graph: bool) -> Sequence[Any]:
        return [grads[0]]


class _Plain(Exception):
    """Carries a result that is no tensor (None, a number, a string) out of an operator's kernel: such a
    function is no torch operator, and its value goes back to the caller as it is."""

    def __init__(self, value: Any) -> None:
        super().__init__("a result that is no tensor")
        self.value = value


def _plain_value(value: Any) -> Any:
    """A plain result for the caller: runtime tensors inside it (a tuple of a tensor and a float) as torch's."""
    if isinstance(value, _Tensor):
        return _to_torch(value, None)
    if isinstance(value, (list, tuple)):
        return type(value)(_plain_value(v) for v in value)
    return value


def _code(who: str, k: int, a: Any) -> str:
    if isinstance(a, torch.Tensor):
        return "t"
    if isinstance(a, bool):
        return "b"
    if isinstance(a, int):
        return "i"
    if isinstance(a, float):
        return "f"
    if isinstance(a, str):
        return "s"
    if a is None:
        return "n"
    if isinstance(a, (list, tuple)) and not a:
        return "e"
    if isinstance(a, (list, tuple)):
        if all(isinstance(e, torch.Tensor) for e in a):
            return "L"
        if all(isinstance(e, int) and not isinstance(e, bool) for e in a):
            return "I"
        if all(isinstance(e, (int, float)) and not isinstance(e, bool) for e in a):
            return "F"
    raise TypeError(f"{who}: argument {k} is a {type(a).__name__}; a torch operator takes tensors, None, ints, "
                    f"floats, bools, strings and lists of tensors, ints or floats")


_GRAD_KINDS = _dtypes.GRAD_KINDS




def _saved_hooks(op: "_Op", recording: bool) -> Any:
    """torch's saved_tensors_hooks in force, as the runtime's (runtime/autograd/saved_hooks.py) while
    ``op`` records: what it saves goes through them as the C++ bridge sends it (torch's SavedVariable),
    zero-copy both ways. None when nothing records or no hooks are set (the caller enters no context)."""
    top = _top_hooks(False) if recording else None
    if top is None:
        return None
    pack, unpack = top

    def unpacked(packed: Any) -> Any:
        t = unpack(packed)
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op.name}: the saved_tensors_hooks unpack hook returned a {type(t).__name__}; "
                            f"it must return a torch.Tensor")
        return _to_runtime(op.name, 0, t, op.devices)

    return _rt_saved_hooks(lambda t: pack(_to_torch(t, None)), unpacked)


class _Op:
    """The torch operators of one module function, one per call signature."""

    def __init__(self, ns: str, lib: Any, name: str, fn: Callable, shape_fn: Optional[Callable],
                 devices: Tuple[str, ...], writes: Tuple[int, ...] = ()) -> None:
        self.ns, self.lib, self.name, self.fn, self.shape_fn, self.devices = ns, lib, name, fn, shape_fn, devices
        self.traced: set = set()  # signatures torch.compile put into a graph (through the shape rule)
        # signatures whose calls write no argument unseen: their first call (fingerprinted) found no write the
        # runtime did not count, and the function declares none (``mutates``). Later calls of them may skip the
        # fingerprints: the lean eager paths and the C++ bridge take only these (its `defined` dict's keys)
        self.checked: Dict[str, bool] = {}
        # signatures seen returning nothing, or writing an argument they do not declare (the out= pattern):
        # each call is fingerprinted, on every route (the bridge leaves them to the Python path)
        self.watched: set = set()
        self.writes = writes  # argument positions it writes in place (declared: Tensor(a!) in the schema)
        self.returns_args = [False]  # seen returning an argument: torch.compile leaves its calls out of graphs
        # sig -> (operator name, [single output?, outputs alias arguments?]); the bridge reads the keys
        self.by_sig: Dict[str, Tuple[Any, List[Optional[bool]]]] = {}
        self.rules: Dict[Tuple[Any, ...], List[Spec]] = {}  # the shape rule's answers, by argument specs

    # ---- the runtime side ----
    def _arg(self, k: int, a: torch.Tensor, flat: int, wants: bool, need: list, index: list, vcs: list,
             nonleaf: bool = False) -> Any:
        """One torch tensor as the runtime tensor the op gets: counting writes on ``a``'s version counter,
        a leaf needing grad when ``wants`` (behind a ``_TorchHistory`` node when ``a`` is a non-leaf)."""
        d = a.detach()  # shares a's memory and version counter, not its history
        if d.is_inference() and not torch.is_inference_mode_enabled():
            # torch allows no in-place update to it here: the op gets a copy, and a write into it is refused
            # (record) with the caller's tensor untouched
            d = d.clone()
        if d.is_cpu and d.dtype in _PLAIN and not d.is_conj() and not d.is_neg():
            r = _Tensor._from_array(d.numpy())
        else:
            r = _to_runtime(self.name, k, a, self.devices)
        vc = None
        if not d.is_inference():  # inference tensors have no counter
            owner = weakref.ref(a) if getattr(_mode, "owners", False) and not a.is_inference() else None
            vc = r._vc = _TorchVersion(d, copy=d.is_conj() or d.is_neg(), owner=owner)
        vcs.append(vc)
        if wants and r._data.dtype.kind in _GRAD_KINDS:
            r.requires_grad = True  # a fresh floating leaf: requires_grad_'s checks hold
            need.append(r)
            index.append(flat)
            if nonleaf or (a.grad_fn is not None and not (a._is_view() and a._base.is_leaf)):
                h = _Tensor._from_array(r._data)
                h._vc = r._vc
                h._node = _TorchHistory(r)
                h.requires_grad = True
                return h
        return r

    def _runtime_args(self, args: Sequence[Any], sig: str, grad: Callable[[torch.Tensor, str], bool],
                      nonleaf: bool = False) -> Tuple[list, list, list, list]:
        """Runtime arguments, the flat runtime tensors needing grad, their flat indices, and each flat
        tensor's version counter (a ``_TorchVersion``, None for an inference tensor)."""
        out: list = []
        need: list = []
        index: list = []
        vcs: list = []
        seen: Dict[int, Tuple[Any, Any]] = {}  # id of a torch tensor -> its runtime tensor and counter

        def arg(k: int, a: torch.Tensor, c: str) -> Any:
            # one torch tensor at several positions is one runtime tensor, as one runtime.Tensor is on the
            # runtime's own route (torch's Function gets one object twice): a tensor an op saves from one
            # position and writes (MarkDirty) through the other is the written one (its gradient a whole
            # one, at the first position)
            if id(a) in seen:
                r, vc = seen[id(a)]
                vcs.append(vc)
                return r
            r = self._arg(k, a, len(vcs), grad(a, c), need, index, vcs, nonleaf)
            seen[id(a)] = (r, vcs[-1])
            return r
        for k, (a, c) in enumerate(zip(args, sig)):
            if c == "t":
                out.append(arg(k, a, c))
            elif c == "L":
                out.append([arg(k, t, c) for t in a])
            else:
                out.append(list(a) if c in "IFe" else a)
        return out, need, index, vcs

    def _run(self, rt_args: list) -> Tuple[list, bool]:
        res = self.fn(*rt_args)
        if isinstance(res, _Tensor):
            return [res], True
        if isinstance(res, (list, tuple)) and all(isinstance(o, _Tensor) for o in res):
            return list(res), False
        if res is None and self.writes:  # an out= function: no outputs, its writes are declared
            return [], False
        raise _Plain(res)  # None (an out= function), a number, a string: no torch operator's result

    def _run_recording(self, rt_args: list, need: list) -> Tuple[list, bool]:
        """``_run``, in the runtime's grad mode when an input needs grad (torch's is off inside a Function)."""
        if need and not _rt_grad.enabled:
            with _rt.enable_grad():
                return self._run(rt_args)
        return self._run(rt_args)

    def record(self, sig: str, args: Sequence[Any], every: bool = False) -> Tuple[List[Any], _Call]:
        """Run the op on ``args`` (recording the runtime graph when an input needs grad; ``every``: each
        tensor argument, as torch.func's unwrapped ones do not say): its runtime outputs and the call
        (what it recorded, which outputs are arguments, which arguments it wrote)."""
        record = getattr(_mode, "grad", True)
        if self.writes:  # decided before the call: a refusal leaves the data untouched
            _refuse_out_inference(self, sig, args)
            if record:
                _refuse_out_grad(self, sig, args)
        # torch.func (``every``): each argument a non-leaf to the runtime, so an op writing one (MarkDirty) is
        # not refused as a leaf that requires grad, but by _Func's named NotImplementedError
        rt_args, need, index, vcs = self._runtime_args(
            args, sig, (lambda t, c: c == "t") if every else (lambda t, c: record and t.requires_grad), every)
        # a signature's first call on any route, and every call of one seen returning nothing or writing an
        # argument it does not declare (an out= function): each tensor argument checksummed, a write the
        # runtime did not count found after the call (_unannounced). The C++ bridge takes only `checked`
        # signatures, so every watched call comes here: one rule for both routes
        watch = None
        if not self.writes and (sig in self.watched or sig not in self.checked):
            flat_rt = _flat(rt_args, sig)
            flat_t = _flat(args, sig)
            # an inference tensor has no counter, but its bytes show a write as well as any tensor's
            watch = _snapshot_shared([_watch(vc if vc is not None or not t.is_inference() else
                                             _Uncounted(t.detach()), r) for vc, r, t in zip(vcs, flat_rt, flat_t)])
        try:
            hooks = _saved_hooks(self, need)  # torch's saved_tensors_hooks, for what the op saves
            if hooks is None:
                outs, single = self._run_recording(rt_args, need)
            else:
                with hooks:
                    outs, single = self._run_recording(rt_args, need)
        except _Plain as p:
            if watch is not None:
                _after_watch(self, sig, args, watch, p.value is None)
            if any(v is not None and v.written for v in vcs):  # seen writing its argument (torch.func refuses
                self.by_sig[sig][1][1] = True                 # it from now on, before it runs)
                self.returns_args[0] = True
                p._ob_dirty = True
            p._ob_rebase = _settle(self, sig, rt_args, args, need, index, vcs, True)  # (None under torch.func)
            raise
        except BaseException as e:
            # no ctx.mark_dirty will follow: writes the runtime counted go to torch's counters now, or, for an
            # argument an inner Function wrote before a later one raised, to _rebase's (as torch's x.mul_(3)
            # before an error leaves x written, its history the write's)
            rebase = _settle(self, sig, rt_args, args, need, index, vcs, False)
            if watch is not None:
                _unannounced(self, sig, args, watch, raised=True)
            if isinstance(e, RuntimeError) and _rules.is_leaf_write_refusal(e):  # torch's words for its own
                err = _torch_write_refusal(e, args)  # tensors, as the bridge gives them
                err._ob_rebase = rebase  # (what an earlier Apply of the call wrote)
                raise err from None
            if rebase is not None:
                try:
                    e._ob_rebase = rebase  # type: ignore[attr-defined]
                except AttributeError:  # (an exception without a __dict__: the history stays as it was)
                    pass
            raise
        if watch is not None:
            _after_watch(self, sig, args, watch, False)
        alias = []
        for o in outs:  # an argument returned unchanged (or written and returned) counts on its counter
            vc = o._vc
            k = -1
            if type(vc) is _TorchVersion:
                for i, v in enumerate(vcs):
                    if v is vc:
                        k = i
                        break
            alias.append(k)
        if self.writes:  # a declared write (out=) counts on the argument's version counter, as torch's out= does
            _bump_declared(self, sig, args, vcs)
        dirty = [i for i, v in enumerate(vcs) if v is not None and v.written]
        # what the call showed, noted before a refusal below: a signature seen writing or returning an
        # argument never takes forward_direct, which hands the op the caller's memory unchecked
        info = self.by_sig[sig][1]
        info[0] = single
        # (kept once seen: a call on an inference tensor in inference mode counts no write, it has no counter)
        info[1] = bool(info[1]) or bool(dirty) or any(k >= 0 for k in alias)
        info[2] = _repeats(outs)  # (torch.func takes that: its refusal is for arguments returned or written)
        if info[1] or info[2]:
            self.returns_args[0] = True
        if dirty and _copy_args(args, sig, vcs).intersection(dirty):  # refused; the others' writes settled first
            _refuse_copy_writes(self, sig, args, dirty, vcs,
                                _settle(self, sig, rt_args, args, need, index, vcs, False))
        written = None
        late: Tuple[int, ...] = ()
        if need and len(alias) == 1 and alias[0] in dirty and _flat(args, sig)[alias[0]]._is_view():
            # a view written in place and returned: torch's CopySlices takes the node's first input for the
            # view's, which the call's node may not have first (add_into(y, x)). _Rebase gives it its
            # history (the view first), and the call returns the argument after it
            late = (alias[0],)
        if need and any(i not in alias or i in late for i in dirty):
            flat_rt = _flat(rt_args, sig)
            # (one tensor at two positions: returned at one)
            returned = [flat_rt[k] for k in alias if k >= 0 and k not in late]
            written = {i: flat_rt[i] for i in dirty if (i not in alias or i in late) and flat_rt[i].requires_grad
                       and not any(flat_rt[i] is r for r in returned)}
        call = _Call(need, index, outs, alias, dirty, bool(need), len(vcs), vcs, written, late)
        flat_rt = flat_t = None
        ranges: Dict[int, Any] = {}
        for j, o in enumerate(outs):  # (an argument a Function wrote is its own output: marked dirty)
            if o._node is None or type(o._node) is _TorchHistory:  # (what a Function made has a node of its own)
                if flat_rt is None:
                    flat_rt, flat_t = _flat(rt_args, sig), _flat(args, sig)
                for k, r in enumerate(flat_rt):
                    if o is r and k not in dirty:
                        call.asis += ((j, k, None),)
                        break
                else:
                    if alias[j] < 0 and o._node is None:  # a Tensor over an argument's memory: a view of it
                        k = _over_argument(o._data, flat_t, flat_rt, ranges)
                        if k >= 0:  # (of one the call wrote too: its history is the write's by then)
                            call.asis += ((j, k, o._data),)
        if call.asis and not info[1]:  # (an output over an argument: no direct path, no compiled graph)
            info[1] = self.returns_args[0] = True
        return outs, call

    def _refuse_compiled(self, what: str = "its argument unchanged") -> None:
        """A call from a compiled graph traced before the op was seen returning its argument unchanged (a
        view of it, one tensor twice: ``what``): the graph takes each result for new memory of its own, so
        the call is an error, never a wrong value; later traces leave the op out of the graph. (A MarkDirty
        write is refused where torch's autograd sees the output: setup_context and the backward op.)"""
        raise RuntimeError(
            f"{self.name} returns {what}, which a compiled graph cannot express (a torch operator's output is "
            f"new memory of its own), and its first call was compiled: torch.compile now leaves it out of the "
            f"graph, so compile again (torch._dynamo.reset(), or call it once eagerly before compiling)")

    def _refuse_dirty_compiled(self) -> None:
        """A MarkDirty write from a compiled graph traced before the op was seen writing: the graph took
        the output for new memory, so its gradient cannot be right; later traces leave the op out."""
        self.returns_args[0] = True
        raise RuntimeError(
            f"{self.name} writes its argument in place (MarkDirty), which a compiled graph cannot express, "
            f"and its first call was compiled: torch.compile now leaves it out of the graph, so compile "
            f"again (or call it once eagerly before compiling); this call's write has been done")

    def to_torch_outputs(self, sig: str, args: Sequence[Any], outs: List[Any], call: _Call) -> List[torch.Tensor]:
        """The runtime outputs as torch tensors: an argument returned unchanged as a view of the torch
        argument (sharing its version counter, as torch's Functions return it), one written in place
        (MarkDirty) as the argument itself, whose counter the write bumped; new memory as a new tensor,
        whose counter the runtime output counts on from now (an op may have saved it)."""
        flat = None
        res: List[Any] = [None] * len(outs)
        made: Dict[Any, Tuple[torch.Tensor, Any]] = {}  # a new output's (counter, layout) -> its torch tensor, its runtime one
        on_vc: Dict[int, Tuple[torch.Tensor, Any]] = {}  # a shared counter -> the output the others are views of
        # (one output can repeat or view no other: the common call reads no layouts)
        keys = _output_keys(outs) if len(outs) > 1 else [(None, id(o)) for o in outs]
        roots = _view_roots(outs, keys) if len(outs) > 1 else {}
        # the outputs others are views of first ({y[2:], y}: y), then the rest
        for j in sorted(range(len(outs)), key=lambda j: keys[j][0] is not None and roots.get(keys[j][0]) != j):
            o, k, (vc, layout) = outs[j], call.alias[j], keys[j]
            if k < 0 and (vc, layout) in made:  # one tensor returned twice: the same torch tensor, as torch's
                t, first = made[(vc, layout)]   # Function returns it (one counter; the later output's gradient)
                o._vc = first._vc
                res[j] = t
                continue
            if k < 0 and vc in on_vc:  # a view Forward built over another output ({y, y[:2]}): torch's view
                t, first = on_vc[vc]
                view = _view_over(t, o._data)
                if view is not None:
                    o._vc = first._vc
                    made[(vc, layout)] = (view, o)
                    res[j] = view
                    continue
            if k >= 0:
                if flat is None:
                    flat = _flat(args, sig)
                a = flat[k]
                if (o._data.shape == tuple(a.shape) and _TORCH_DT.get(o._data.dtype, a.dtype) == a.dtype
                        and _strides_match(o._data, a)):
                    res[j] = a if k in call.dirty and k not in call.late else a.view_as(a)
                    continue
                view = _view_over(a, o._data)
                if view is not None:  # a view Forward built over the argument's memory: torch's view of it, as
                    res[j] = view     # torch's Function's x[:1] is (its counter, its base)
                    continue
            t = _to_torch(o, None)
            if call.recorded:
                o._vc = _TorchVersion(t.detach(), o._version)
            made[(vc, layout)] = (t, o)
            if vc is not None:
                on_vc.setdefault(vc, (t, o))
            res[j] = t
        if self.shape_fn is not None:
            self.check_rule(sig, args, res)
        return res

    def check_rule(self, sig: str, args: Sequence[Any], res: Sequence[torch.Tensor]) -> None:
        """The shape rule's shapes and dtypes against the real outputs (torch.compile's fake kernel trusts
        it): a named error on a mismatch, on every eager call."""
        keys = tuple(_spec_key(a, c) for a, c in zip(args, sig))
        # by type and exact value (issue 33 #8): True and 1, 0.0 and -0.0 may get different rules' answers
        key = (sig, tuple(k if c in "tL" else _exact_key(k) for k, c in zip(keys, sig)))
        specs = self.rules.get(key)
        if specs is None:
            specs = as_specs(self.name, self.shape_fn(*_specs(keys, sig)))[0]
            if len(self.rules) > 4096:  # many shapes (dynamic=True): keep the newest
                self.rules.clear()
            self.rules[key] = specs
        if len(specs) != len(res):
            raise RuntimeError(f"{self.name}: the shape rule describes {len(specs)} output(s), but the operator "
                               f"returned {len(res)}; fix the rule (shape_fn or the C++ InferShape)")
        for j, (s, t) in enumerate(zip(specs, res)):
            if tuple(t.shape) != s.shape or _TORCH_DT.get(s.dtype) != t.dtype:
                raise RuntimeError(
                    f"{self.name}: the shape rule says output {j} is {s.dtype.name}{list(s.shape)}, but the "
                    f"operator returned {str(t.dtype)[6:]}{list(t.shape)}; torch.compile would read the output "
                    f"with the rule's shape and dtype, so fix the rule (shape_fn or the C++ InferShape)")

    def forward_impl(self, sig: str, args: Sequence[Any], kernel: bool = False) -> List[torch.Tensor]:
        """The registered operator's kernel (``kernel``: called by torch's dispatcher, from an eager call
        or from a compiled graph) and the eager path's without grad."""
        outs, call = self.record(sig, args)
        try:
            seen = self.by_sig[sig][1]
            if kernel and sig in self.traced and (seen[1] or seen[2]) and not getattr(_mode, "eager", False):
                if not call.dirty:
                    self._refuse_compiled(_returned(outs, call, args, sig))
                if not self.writes:  # here, before torch's own alias check (an error under CI=1, else a warning)
                    self._refuse_dirty_compiled()
            res = self.to_torch_outputs(sig, args, outs, call)
        except BaseException:
            _flush_pending(call.vcs)  # nothing will be marked dirty: counted writes go to torch's counters
            raise
        if kernel:  # for setup_context, which torch calls right after on this thread (an op a dispatch mode
            _mode.last = (tuple(args), call)  # calls after the kernel, off the registered path, keeps it)
        elif call.asis:  # (the eager path without grad: no torch node, the arguments handed back here)
            res = _returned_arguments(res, _flat(args, sig), call)
        return res

    def forward_direct(self, sig: str, tpos: Tuple[int, ...], args: Sequence[Any]) -> List[torch.Tensor]:
        """``forward_impl`` for an eager call that records nothing and whose outputs were never arguments:
        the C++ op takes each CPU tensor's numpy view as it is (no runtime.Tensor in between), and its
        results go back through ``torch.from_numpy``. Anything numpy cannot view takes ``forward_impl``."""
        if self.writes:
            _refuse_out_inference(self, sig, args)
        conv = list(args)
        try:
            for i in tpos:
                t = conv[i]
                conv[i] = (t.detach() if t.requires_grad else t).numpy()
        except (TypeError, RuntimeError):  # another device, bfloat16, a conjugate view: say why there
            _mode.grad = torch.is_grad_enabled()
            return self.forward_impl(sig, args)
        res = self.fn(*conv)
        if isinstance(res, (list, tuple)):
            out = self._direct_outs(res, conv, tpos, args, sig)
        elif not isinstance(res, _Tensor):
            raise _Plain(res)
        else:
            data = res._data
            # a base that is an argument's array: the op returned that argument (_direct_out says how)
            if type(data) is np.ndarray and (type(data.base) is not np.ndarray or _fresh(data.base, conv, tpos)):
                try:
                    out = [torch.from_numpy(data)]
                except (TypeError, ValueError):  # bfloat16, negative strides
                    out = [_from_numpy(data)]
            else:
                out = [self._direct_out(res, conv, tpos, args, sig)]
        if self.shape_fn is not None:
            self.check_rule(sig, args, out)
        return out

    def _direct_outs(self, res: Sequence[Any], conv: list, tpos: Tuple[int, ...], args: Sequence[Any],
                     sig: str) -> List[torch.Tensor]:
        # apart from forward_direct: a comprehension there would make its locals cells on every call
        return [self._direct_out(o, conv, tpos, args, sig) for o in res]

    def _direct_out(self, o: Any, conv: list, tpos: Tuple[int, ...], args: Sequence[Any], sig: str) -> torch.Tensor:
        if not isinstance(o, _Tensor):
            raise _Plain(o)
        base = getattr(o._data, "base", None)
        if base is not None:
            for i in tpos:  # an argument returned (first seen here): a view of it, and no direct path again
                if base is conv[i] and o._data.shape == conv[i].shape and o._data.strides == conv[i].strides:
                    self.by_sig[sig][1][1] = True
                    return args[i]  # as torch's `return x`
        return _to_torch(o, None)

    def backward_impl(self, sig: str, grads: List[Optional[torch.Tensor]], args: Optional[Sequence[Any]],
                      call: Optional[_Call] = None) -> List[Optional[torch.Tensor]]:
        """Input gradients (None for none), one per flat tensor argument: through the recorded runtime call
        or, when there is none (a compiled graph), through a new recording of the forward on ``args``."""
        if call is None or not call.recorded or len(call.outputs) != len(grads):  # record the forward again
            # on copies: the caller's tensors are never written twice. Tensors in lists get no gradients
            # from a Function (the runtime says so when they need one)
            copies = [a.detach().clone() if c == "t" else [t.detach().clone() for t in a] if c == "L" else a
                      for a, c in zip(args, sig)]
            rt_args, need, index, vcs = self._runtime_args(copies, sig, lambda t, c: c == "t", nonleaf=True)
            with _rt.enable_grad():
                outs, _ = self._run(rt_args)
            if any(v is not None and v.written for v in vcs):
                self._refuse_dirty_compiled()
            call, retain = _Call(need, index, outs, nflat=len(vcs)), False
        else:
            retain = True  # torch may call backward again on its graph (gradcheck does)
        pairs = [(o, _to_runtime(self.name, i, g, self.devices))
                 for i, (o, g) in enumerate(zip(call.outputs, grads)) if o.requires_grad and g is not None]
        return _input_grads(call, pairs, retain)

    # ---- the torch side ----
    def define(self, sig: str, args: Optional[Sequence[Any]]) -> Tuple[str, List[Optional[bool]]]:
        """Define the forward and backward operators for call signature ``sig`` (``args``: its
        arguments as ``_spec_key`` gives them; None while torch.compile traces, where the fake kernel
        asks the shape rule)."""
        opname = f"{self.name}_{sig}" if sig else self.name
        for k in self.writes:
            if k >= len(sig) or sig[k] != "t":
                raise TypeError(f"{self.name}: mutates names argument {k}, but in this call it is "
                                f"{'missing' if k >= len(sig) else 'no tensor'}; declare the positions of tensors "
                                f"the function writes")
        tags = iter("abcdefghijklmnopqrstuvwxyz")
        params = ", ".join(f"Tensor({next(tags)}!) a{k}" if k in self.writes else f"{_SCHEMA[c]} a{k}"
                           for k, c in enumerate(sig))
        info: List[Optional[bool]] = [None, False, False]  # one output; returns/writes an argument; repeats one
        if self.shape_fn is not None and args is not None:  # first: a rule that fails leaves nothing half-defined
            info[0] = as_specs(self.name, self.shape_fn(*_specs(args, sig)))[1]
        # an out= function (it writes declared arguments, its rule gives no outputs) returns nothing
        void = bool(self.writes) and self.shape_fn is not None and (
            args is None or not as_specs(self.name, self.shape_fn(*_specs(args, sig)))[0])
        self.lib.define(f"{opname}({params}) -> {'()' if void else 'Tensor[]'}")
        bparams = ", ".join(f"{_SCHEMA[c]} a{k}" for k, c in enumerate(sig))
        self.lib.define(f"{opname}_backward(Tensor[] outputs, Tensor[] grads{', ' if bparams else ''}{bparams}) "
                        f"-> Tensor[]")
        # every device reaches the Python kernel, which names the devices it takes (a clear error)
        key = "CompositeExplicitAutograd"
        def kernel(*a: Any) -> Optional[List[torch.Tensor]]:
            # an eager call (_run_registered): the writes the runtime counts wait for setup_context's
            # ctx.mark_dirty, which bumps torch's counter once (else each was bumped twice)
            eager = getattr(_mode, "eager", False)
            defer, _mode.defer = getattr(_mode, "defer", False), eager
            kernel_grad = getattr(_mode, "kernel_grad", None)
            if kernel_grad is not None and _mode.defer:  # (an eager call's: _run_registered)
                _mode.grad = kernel_grad
            try:
                out = self.forward_impl(sig, a, True)
            finally:
                _mode.defer = defer
            if void and out:  # defined while torch.compile traced, as an out= function: no output to give
                self.returns_args[0] = True  # later traces leave it out of the graph
                raise RuntimeError(_mutates_returns(self.name))
            if not eager and out:  # a graph's call: contiguous new outputs, as the fake below says (inductor
                # checks strides; a Spec has none), arguments returned as they are
                out = [o if o is None or o.is_contiguous() or any(o is x for x in a) else o.contiguous() for o in out]
            return None if void else out
        self.lib.impl(opname, kernel, key)

        def backward_kernel(outputs: List[torch.Tensor], grads: List[torch.Tensor], *a: Any) -> List[torch.Tensor]:
            flat = _flat(a, sig)
            call, _mode.bwd_call = getattr(_mode, "bwd_call", None), None  # torch.func's backward hands it
            res = self.backward_impl(sig, list(grads), a, call)
            # contiguous, as the fake below says (a transposed argument's gradient too: inductor checks)
            return [torch.zeros(t.shape, dtype=t.dtype, device=t.device) if r is None else r.contiguous()
                    for t, r in zip(flat, res)]
        self.lib.impl(f"{opname}_backward", backward_kernel, key)
        qual = f"{self.ns}::{opname}"
        if self.shape_fn is not None:
            torch.library.register_fake(qual, self._fake(sig, void), lib=self.lib)
            torch.library.register_fake(f"{qual}_backward", lambda outputs, grads, *a: [
                torch.empty(t.shape, dtype=t.dtype, device=t.device)
                for x, c in zip(a, sig) if c in "tL" for t in ([x] if c == "t" else x)], lib=self.lib)
        bwd = getattr(getattr(torch.ops, self.ns), f"{opname}_backward").default
        if not self.writes:  # kept in graphs even when its result is unused: until it has run, whether it
            # writes an argument (MarkDirty) is unknown, and dead-code elimination would drop the write
            torch.fx.node.has_side_effect(getattr(torch.ops, self.ns).__getattr__(opname).default)
        ntensor = sum(1 for c in sig if c in "tL")

        def setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Any) -> None:
            ctx.args = tuple(None if c in "tL" else a for a, c in zip(inputs, sig))
            ctx.lens = [len(a) if c == "L" else 1 for a, c in zip(inputs, sig)]
            last, _mode.last = getattr(_mode, "last", None), None
            call = None
            if last is not None and not _is_compiling() and _same_call(last[0], inputs, sig):
                call = last[1]  # the call the kernel just ran for these very arguments
            ctx.call = call
            ctx.out_meta = [(o.shape, o.dtype, o.device) for o in output]
            if call is None:  # a compiled graph: the backward op records the forward again, from the
                # arguments, saved as torch saves them: one written after the call fails its version check.
                # The outputs are not saved (the backward does not read them): a write into one afterwards
                # is allowed, as after torch's own x * y (nn.ReLU(inplace=True) after the op)
                ctx.save_for_backward(*_flat(inputs, sig))
                return
            # torch frees what a node saved after a backward without retain_graph, and a second backward
            # then raises its "a second time" error: a saved empty tensor gives this node that rule
            _save_mark(ctx)
            ctx.once_in = _undirtied(inputs, sig, call.dirty)
            # what the runtime recorded no gradient for (MarkNonDifferentiable, integers, a plain C++
            # function) does not require grad in torch either: no silent zero gradients
            no_grad = [o for o, r in zip(output, call.outputs) if not (call.recorded and r.requires_grad)]
            if no_grad:
                ctx.mark_non_differentiable(*no_grad)
            dirty = _once_each(o for o, k in zip(output, call.alias) if k in call.dirty and k >= 0
                               and k not in call.late)
            if dirty:
                ctx.mark_dirty(*dirty)
            if call.dirty:  # (an argument written and not returned too: its write goes to torch's counter,
                _marked(call)  # or to _Rebase's mark_dirty, which _run_registered applies after the call)
            if call.written or call.asis:
                _mode.written = (self, sig, inputs, call)

        def backward(ctx: Any, grads: List[Optional[torch.Tensor]]) -> Tuple[Any, ...]:
            call = ctx.call
            saved = ctx.saved_tensors  # raises torch's error on a second backward without retain_graph
            gs = [torch.zeros(s, dtype=d, device=dev) if g is None else g
                  for g, (s, d, dev) in zip(grads, ctx.out_meta)]
            if call is not None:
                flat = self.backward_impl(sig, gs, None, call)
                it = iter(_once(self.name, flat, grads, any(ctx.needs_input_grad), ctx.once_in))
            else:
                it0 = iter(saved)
                args = [next(it0) if c == "t" else [next(it0) for _ in range(n)] if c == "L" else a
                        for a, c, n in zip(ctx.args, sig, ctx.lens)]
                it = iter(bwd(gs, gs, *args))  # (its `outputs`: the kernel reads the arguments only)
            res = []
            for n, c in zip(ctx.lens, sig):
                if c == "t":
                    res.append(next(it))
                elif c == "L":
                    res.append([next(it) for _ in range(n)])
                else:  # (torch.library reads an empty list as one of tensors: its gradient is [])
                    res.append([] if c == "e" else None)
            return tuple(res)

        if ntensor and not self.writes:
            torch.library.register_vmap(qual, self._vmap(qual), lib=self.lib)
        if ntensor and not self.writes:  # torch has no autograd formula for ops that write their arguments
            torch.library.register_autograd(qual, backward, setup_context=setup_context, lib=self.lib)
        self.by_sig[sig] = (opname, info)
        return self.by_sig[sig]

    def _vmap(self, qual: str) -> Callable:
        """torch.vmap's rule: the operator once per batch element (a loop; lists of tensors are taken
        as they are), the results stacked along dimension 0."""
        ns, name = qual.split("::")

        def rule(info: Any, in_dims: Tuple[Any, ...], *args: Any) -> Tuple[List[torch.Tensor], List[int]]:
            if any(isinstance(d, (list, tuple)) and any(e is not None for e in d) for d in in_dims):
                raise NotImplementedError(f"{self.name}: torch.vmap over a list of tensors is not supported; "
                                          f"vmap over tensor arguments")
            op = getattr(getattr(torch.ops, ns), name).default
            per = _per_element(self.name, lambda *e: op(*e), args, in_dims, info.batch_size)
            out = [_stacked([p[j] for p in per], info.batch_size) for j in range(len(per[0]))]
            return out, [0] * len(out)
        return rule

    def _fake(self, sig: str, void: bool = False) -> Callable:
        def fake(*args: Any) -> Optional[List[torch.Tensor]]:
            keys = [_spec_key(a, c) for a, c in zip(args, sig)]
            specs, single = as_specs(self.name, self.shape_fn(*_specs(keys, sig)))
            info = self.by_sig[sig][1]
            if info[0] is None:
                info[0] = single
            dev = next(t.device for a, c in zip(args, sig) if c in "tL" for t in ([a] if c == "t" else a))
            if void:
                return None
            return [torch.empty(s.shape, dtype=_TORCH_DT[s.dtype], device=dev) for s in specs]
        return fake


def _mutates_returns(name: str) -> str:
    """Why a function declared in ``mutates`` that returns tensors cannot run in a compiled graph."""
    return (f"{name} is declared in mutates and returns tensors, which its compiled form cannot give (a torch "
            f"operator's outputs are new memory of its own, and one defined while torch.compile traced it is "
            f"taken for an out= function, returning nothing): return nothing from it (the out= pattern, its "
            f"shape rule giving no outputs), or drop mutates= (torch.compile then runs it eagerly); this call "
            f"ran it, and whether its write reached the caller's tensors depends on the backend (aot_eager "
            f"writes a functional copy)")


def _flat_tensors(args: Sequence[Any]) -> List[torch.Tensor]:
    """``_flat(args, sig)`` without the signature: the tensor arguments, those in lists too."""
    return [t for a in args for t in ([a] if isinstance(a, torch.Tensor) else a if isinstance(a, (list, tuple))
                                      and a and all(isinstance(x, torch.Tensor) for x in a) else [])]


def _run_registered(overload: Any, args: Sequence[Any]) -> Any:
    """An eager call of the registered operator (not a compiled graph's): its kernel defers the writes the
    runtime counts to setup_context's ctx.mark_dirty; a call torch records no node for (no argument needs
    grad) runs no setup_context, so they go to torch's counters here."""
    # what an outer call on this thread set is put back after: a dispatch mode may call another op (a
    # logger's) inside this one, before its kernel runs
    eager, _mode.eager = getattr(_mode, "eager", False), True
    owners, _mode.owners = getattr(_mode, "owners", False), True  # (the kernel may run below ADInplaceOrView)
    # the grad mode route() saw for this call, which the kernel (where torch's is off) records by; an op
    # the mode calls first sets _mode.grad for itself
    kernel_grad, _mode.kernel_grad = getattr(_mode, "kernel_grad", None), getattr(_mode, "grad", True)
    grad, before = getattr(_mode, "grad", True), getattr(_mode, "last", None)
    try:
        out = _rebasing(overload, *args)
        last = getattr(_mode, "last", None)
        if last is not None and last is not before and last[1].asis and out is not None:
            # a call torch records no node for (setup_context, where _rebasing hands them back, did not run),
            # if the kernel ran on these very tensors (a dispatch mode may have called it on others)
            mine, ran = _flat_tensors(args), _flat_tensors(last[0])
            if len(mine) == len(ran) and all(a is b for a, b in zip(mine, ran)):
                out = _returned_arguments(out, mine, last[1])
        return out
    finally:
        _mode.eager, _mode.owners, _mode.grad, _mode.kernel_grad = eager, owners, grad, kernel_grad
        last, _mode.last = getattr(_mode, "last", None), before
        if last is not None and last is not before:
            _flush_pending(last[1].vcs)


def _same_call(ran: Sequence[Any], inputs: Sequence[Any], sig: str) -> bool:
    """Whether the kernel's last call (``ran``) had these very ``inputs``: tensors by identity, everything
    else by type and exact value (the dispatcher hands each side its own Python float, or int above 256,
    so identity would take an eager call for a compiled one)."""
    if len(ran) != len(inputs) or len(inputs) != len(sig):
        return False
    for x, y, c in zip(ran, inputs, sig):
        if c == "t":
            if x is not y:
                return False
        elif c == "L":
            if len(x) != len(y) or any(a is not b for a, b in zip(x, y)):
                return False
        elif c in "IFe":
            if len(x) != len(y) or any(_exact_key(a) != _exact_key(b) for a, b in zip(x, y)):
                return False
        elif _exact_key(x) != _exact_key(y):
            return False
    return True


def _over_argument(arr: Any, flat: Sequence[torch.Tensor], flat_rt: Sequence[Any], ranges: Dict[int, Any]) -> int:
    """The flat position of the argument whose memory ``arr`` is over (a Tensor a module function built on
    x->storage()), or -1: the one whose runtime array ``arr`` is made from (its ``base`` chain: two
    arguments may share a storage, ``a`` and ``a.detach()``), else the first CPU argument of its dtype
    whose storage holds its first element; either on that storage's element grid (not the private copy an
    inference tensor or a conjugate view gets). ``ranges`` caches each argument's storage range."""
    if type(arr) is not np.ndarray or not arr.size or any(st % arr.itemsize for st in arr.strides):
        return -1
    p = arr.__array_interface__["data"][0]

    def holds(k: int) -> bool:
        a = flat[k]
        if not a.is_cpu or not a.numel() or _TORCH_DT.get(arr.dtype) != a.dtype:
            return False
        if k not in ranges:
            lo = a.data_ptr() - a.storage_offset() * a.element_size()
            ranges[k] = (lo, lo + a.untyped_storage().nbytes())
        lo, hi = ranges[k]
        return lo <= p < hi and not (p - lo) % a.element_size()
    base = arr.base
    while base is not None:
        for k, r in enumerate(flat_rt):
            if r._data is base:
                return k if holds(k) else -1
        base = getattr(base, "base", None)
    for k in range(len(flat)):
        if holds(k):
            return k
    return -1


def _strides_match(arr: Any, t: torch.Tensor) -> bool:
    """The array (a runtime output) has the torch tensor's element strides and first element."""
    if type(arr) is not np.ndarray:
        return True  # CUDA memory the op returned unchanged: one tensor, one layout
    if arr.size == 0:
        return True  # no element: any strides and address describe it (numpy's and torch's differ)
    item = arr.itemsize
    return (all(s == st * item for s, st, n in zip(arr.strides, t.stride(), arr.shape) if n > 1)
            and arr.__array_interface__["data"][0] == t.data_ptr())


class _Eager(torch.autograd.Function):
    """What the registered operator's autograd does (same forward and backward kernels), for eager
    calls that no mode or tensor subclass needs to see: torch.library's Python autograd layer
    (pytree, defaults, redispatch) costs more than the C++ op itself on small tensors."""

    @staticmethod
    def forward(ctx: Any, op: "_Op", sig: str, *args: Any) -> Tuple[torch.Tensor, ...]:
        _mode.defer = True  # the writes it marks dirty: torch's mark_dirty bumps their counters
        try:
            rt_outs, call = op.record(sig, args)
        finally:
            _mode.defer = False
        try:
            outs = op.to_torch_outputs(sig, args, rt_outs, call)
        except BaseException:
            _marked(call)  # nothing will be marked: the writes the runtime counted go to torch's counters
            raise
        # what the runtime recorded no gradient for (MarkNonDifferentiable, integers, a plain C++
        # function) does not require grad in torch either: no silent zero gradients
        no_grad = [t for t, o in zip(outs, rt_outs) if not (call.recorded and o.requires_grad)]
        if no_grad:
            ctx.mark_non_differentiable(*no_grad)
        dirty = _once_each(t for t, k in zip(outs, call.alias) if k >= 0 and k in call.dirty and k not in call.late)
        if dirty:
            ctx.mark_dirty(*dirty)
        if call.dirty:
            _marked(call)
        if call.written or call.asis:
            _mode.written = (op, sig, args, call)
        ctx.op, ctx.sig, ctx.call = op, sig, call  # the runtime graph lives as long as torch's node
        ctx.once_in = _undirtied(args, sig, call.dirty)
        _save_mark(ctx)  # torch's rule for a second backward (setup_context's)
        return tuple(outs)

    @staticmethod
    def backward(ctx: Any, *grads: Optional[torch.Tensor]) -> Tuple[Any, ...]:
        ctx.saved_tensors  # raises torch's error on a second backward without retain_graph
        flat = ctx.op.backward_impl(ctx.sig, list(grads), None, ctx.call)
        it = iter(_once(ctx.op.name, flat, grads, any(ctx.needs_input_grad[2:]), ctx.once_in))
        return (None, None) + tuple(next(it) if c == "t" else None for c in ctx.sig)


def _eager(op: "_Op", sig: str, args: Sequence[Any]) -> Tuple[torch.Tensor, ...]:
    """``_Eager.apply``, then ``_rebase`` for the arguments the call wrote and did not return."""
    return _rebasing(_Eager.apply, op, sig, *args)


class _Func(torch.autograd.Function):
    """``_Eager`` in torch.func's form (forward without ctx, then ``setup_context``): the call's autograd
    under torch.func.grad, vjp, jacrev and vmap (functorch unwraps the arguments before ``forward``, and
    calls ``setup_context`` once per transform level: the runtime call travels as a last, non-tensor
    output). vmap loops over the batch."""

    @staticmethod
    def forward(op: "_Op", sig: str, *args: Any) -> Tuple[Any, ...]:
        try:
            rt_outs, call = op.record(sig, args, every=True)
        except _Plain as p:  # a plain result: a write is refused as for a tensor result (no node marks it)
            if getattr(p, "_ob_dirty", False):  # (its writes went to torch's counters: nothing deferred)
                raise NotImplementedError(_func_returns_arg(op.name)) from None
            raise
        outs = op.to_torch_outputs(sig, args, rt_outs, call)
        if call.dirty or call.asis or any(k >= 0 for k in call.alias):  # (as later calls are refused before
            raise NotImplementedError(_func_returns_arg(op.name))                  # they run)
        return (*outs, call)

    @staticmethod
    def setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Any) -> None:
        call = output[-1]
        ctx.op, ctx.sig, ctx.call = inputs[0], inputs[1], call
        ctx.args = tuple(None if c == "t" else a for a, c in zip(inputs[2:], inputs[1]))
        ctx.save_for_backward(*[a for a, c in zip(inputs[2:], inputs[1]) if c == "t"])
        no_grad = [t for t, o in zip(output, call.outputs) if not (call.recorded and o.requires_grad)]
        if no_grad:
            ctx.mark_non_differentiable(*no_grad)

    @staticmethod
    def backward(ctx: Any, *grads: Optional[torch.Tensor]) -> Tuple[Any, ...]:
        op, sig, grads = ctx.op, ctx.sig, grads[:-1]
        if any(g is not None and _is_wrapped(g) for g in grads):  # torch.func's: through the backward op,
            for g in grads:                                       # whose kernel sees plain tensors
                _refuse_batched(op.name, g)
            gs = [torch.zeros(o._data.shape, dtype=_TORCH_DT[o._data.dtype]) if g is None else g
                  for g, o in zip(grads, ctx.call.outputs)]
            saved = iter(ctx.saved_tensors)
            args = [next(saved) if c == "t" else a for a, c in zip(ctx.args, sig)]
            bwd = getattr(getattr(torch.ops, op.ns), f"{op.by_sig[sig][0]}_backward").default
            _mode.bwd_call = ctx.call
            try:
                flat = list(bwd(gs, gs, *args))
            finally:
                _mode.bwd_call = None
        else:
            flat = op.backward_impl(sig, list(grads), None, ctx.call)
        it = iter(_once(ctx.op.name, flat, grads, any(ctx.needs_input_grad[2:])))
        return (None, None) + tuple(next(it) if c == "t" else None for c in ctx.sig)

    @staticmethod
    def vmap(info: Any, in_dims: Tuple[Any, ...], op: "_Op", sig: str, *args: Any) -> Tuple[Any, Any]:
        per = _per_element(op.name, lambda *e: _Func.apply(op, sig, *e), args, in_dims[2:], info.batch_size)
        outs = tuple(_stacked([p[j] for p in per], info.batch_size) for j in range(len(per[0]) - 1))
        return (*outs, per[-1][-1]), (*(0 for _ in outs), None)


def _per_element(name: str, run: Callable[..., Any], args: Sequence[Any], in_dims: Sequence[Any],
                 batch_size: int) -> List[Any]:
    """``run`` on each batch element of a torch.vmap call. An empty batch has none: one run on stand-ins
    of an element's shape (zeros, else ones, else halves, for an op refusing zeros) gives the outputs'
    shapes, as torch.vmap's own ops give them for no elements."""
    if batch_size:
        return [run(*[a.select(d, b) if isinstance(d, int) else a for a, d in zip(args, in_dims)])
                for b in range(batch_size)]
    def stand_in(a: Any, d: Any, fill: float) -> Any:
        if not isinstance(d, int):
            return a
        s = a.new_full(a.shape[:d] + a.shape[d + 1:], fill)
        return s + a.sum(d) * 0 if a.requires_grad else s  # (in a's graph: the empty result's gradient reaches a)

    first = None
    for fill in (0.0, 1.0, 0.5):
        try:
            return [run(*[stand_in(a, d, fill) for a, d in zip(args, in_dims)])]
        except Exception as e:  # noqa: BLE001  (the op refusing these values)
            first = first or e
    assert first is not None
    first.add_note(f"torch.vmap over an empty batch ran {name} on zeros, ones and halves of an element's shape to "
                   f"learn its outputs' shapes, and each run raised; this is the run on zeros' error")
    raise first


def _stacked(per: List[torch.Tensor], batch_size: int) -> torch.Tensor:
    """The elements' outputs stacked along dimension 0; none (an empty batch, ``per`` the run on zeros): an
    empty tensor of their shape."""
    if batch_size:
        return torch.stack(per)
    return per[0].unsqueeze(0)[:0]  # (a view: in the run's graph, as torch.vmap's own ops' results are)


def _output_keys(outs: Sequence[Any]) -> List[Tuple[Optional[int], Any]]:
    """Per runtime output, what tells one tensor the op returned twice, or a view it built over an earlier
    output: the runtime has the later count writes on the first's version counter (call_rules.h
    ShareCounter). (The counter shared with another output, or None; the memory's address and layout.)"""
    keys = []
    for o in outs:
        vc = o._vc
        d = o._data
        layout = (d.__array_interface__["data"][0], d.shape, d.strides, d.dtype.str) \
            if type(d) is np.ndarray and d.size else id(o)  # (empty arrays may share an address)
        keys.append((id(vc) if vc is not _UNWRITTEN and type(vc) is not _TorchVersion else None, layout))
    return keys


def _returned(outs: Sequence[Any], call: "_Call", args: Sequence[Any], sig: str) -> str:
    """What a call returned that a compiled graph cannot express, in words for its error."""
    if _repeats(outs):
        return "one tensor as two of its outputs"
    flat = _flat(args, sig)
    for o, k in zip(outs, call.alias):
        if k >= 0 and not (o._data.shape == tuple(flat[k].shape) and _strides_match(o._data, flat[k])):
            return "a view of its argument"
    return "its argument unchanged"


def _view_roots(outs: Sequence[Any], keys: Sequence[Tuple[Optional[int], Any]]) -> Dict[int, int]:
    """Per counter new outputs share (the runtime's ShareCounter: one tensor twice, or views it built of
    each other), the output spanning the most bytes (the first, of equal spans): the others are its views."""
    roots: Dict[int, int] = {}
    span: Dict[int, int] = {}
    for j, (o, (vc, _)) in enumerate(zip(outs, keys)):
        if vc is None or type(o._data) is not np.ndarray:
            continue
        d = o._data
        n = d.nbytes and (sum(abs(st) * (m - 1) for st, m in zip(d.strides, d.shape)) + d.itemsize)
        if vc not in roots or n > span[vc]:
            roots[vc], span[vc] = j, n
    return roots


def _repeats(outs: Sequence[Any]) -> bool:
    """Whether the op returned one runtime tensor as two of its outputs (its memory and layout again, on one
    counter), or the same runtime tensor twice."""
    if len(outs) < 2:
        return False
    keys = [(vc, layout) if vc is not None else id(o) for o, (vc, layout) in zip(outs, _output_keys(outs))]
    return len(set(keys)) < len(keys)


def _func_returns_arg(name: str) -> str:
    return (f"{name}: under torch.func an operator may not return its argument (unchanged, a view of it, or written "
            f"in place, MarkDirty), nor write one it does not return; call it outside the transform")


def _refuse_batched(name: str, g: Optional[torch.Tensor]) -> None:
    """A batch of gradients (jacrev, jacfwd, hessian, vmap of grad or vjp) is refused: an operator's
    Backward takes one gradient. So is a gradient that an outer torch.func.grad differentiates (two
    grad levels): the Backward is once-differentiable."""
    levels = 0
    while g is not None and _is_wrapped(g):
        levels += _functorch.is_gradtrackingtensor(g)
        if levels > 1:
            raise RuntimeError(_rules.double_backward_message(name))
        if _functorch.is_batchedtensor(g):
            raise NotImplementedError(
                f"{name}: a batch of gradients (torch.func.jacrev, jacfwd, hessian, or vmap of grad/vjp) cannot go "
                f"through an opbuilder operator's Backward, which takes one gradient; use torch.func.grad or vjp "
                f"one at a time, or torch.autograd.functional.jacobian")
        g = _functorch.get_unwrapped(g)


def _many(out: Sequence[torch.Tensor], op: _Op) -> Any:
    """Several outputs as a tuple (torch's convention); none, from an out= function, as None."""
    return tuple(out) if out or not op.writes else None


def _compiler_disable(fn: Callable, reason: str) -> Callable:
    """``torch.compiler.disable(fn)`` with ``reason`` (torch names it in a fullgraph=True error), where
    this torch takes one."""
    try:
        return torch.compiler.disable(fn, reason=reason)
    except TypeError:  # a torch without reason=
        return torch.compiler.disable(fn)


def _traced_call(self: Any, *args: Any, **kwargs: Any) -> Any:
    """The bridge's Op called as torch.compile traces it: to_torch's Python path (``Op.fallback``).
    Eager calls never run this: they take the Op's C call (src/torch_bridge.cpp ``traced_call``)."""
    return self.fallback(*args, **kwargs)


def _traced_calls(bridge: types.ModuleType) -> None:
    """Makes ``_traced_call`` the bridge Op's ``__call__`` as dynamo sees it (once per bridge module)."""
    if getattr(bridge, "_opbuilder_traced", None) is not _traced_call:
        bridge.traced_call(_traced_call)
        bridge._opbuilder_traced = _traced_call


def _wrapper(op: _Op, owner: Optional["TorchOps"] = None) -> Callable:
    """The user-facing function: picks (or defines) the operator for the call's signature. Once the
    C++ bridge is loaded, its Op (same attributes) replaces the function in ``owner``'s namespace."""
    def define(sig: str, specs: Optional[Tuple[Any, ...]]) -> Tuple[Any, List[Optional[bool]]]:
        with _define_lock:  # two threads' first calls define the operator once
            entry = op.by_sig.get(sig)
            if entry is None:
                entry = op.define(sig, specs)
        return entry

    def ensure(sig: str) -> str:
        # runs eagerly even while torch.compile traces (assume_constant_result): defining an operator
        # is not traceable, and its name is a constant of the call's signature (its shapes may be symbols)
        op.traced.add(sig)
        return define(sig, None)[0]

    ensure._dynamo_marked_constant = True  # type: ignore[attr-defined]  # torch._dynamo.assume_constant_result
    packet = getattr(torch.ops, op.ns)

    fast: Dict[str, Tuple[Any, List[Optional[bool]]]] = {}  # sig -> (OpOverload, info), eager calls
    # the argument types of eager calls whose signature they fix (plain torch.Tensors, no lists) ->
    # (sig, tensor positions, info): the lean path of `call`
    direct: Dict[Tuple[type, ...], Tuple[str, Tuple[int, ...], List[Optional[bool]]]] = {}
    # a C++ function (pybind11, nanobind): it takes numpy arrays as tensors (the lean path above) and
    # torch tensors inside the bridge's frame; a Python one (or an aot op) takes neither
    native = isinstance(op.fn, types.BuiltinFunctionType) or type(op.fn).__name__ == "nb_func"

    def general(*args: Any) -> Any:
        try:
            return route(*args)
        except _Plain as p:  # a function returning None, a number or a string: its value as it is
            return _plain_value(p.value)

    def route(*args: Any) -> Any:
        sig = "".join([_code(op.name, k, a) for k, a in enumerate(args)])
        if not torch.compiler.is_compiling() and _transforms_active() and "L" in sig and any(
                _functorch.is_gradtrackingtensor(t) for a, c in zip(args, sig) if c in "tL"
                for t in ([a] if c == "t" else a)):
            # (torch's own words would be about autograd.Function's setup_context)
            raise NotImplementedError(f"{op.name}: torch.func transforms (grad, vjp, jacrev) over a function "
                                      f"taking a list of tensors are not supported; pass the tensors as "
                                      f"arguments of their own, or use torch.autograd")
        if not torch.compiler.is_compiling() and _transforms_active() and "L" not in sig:
            if any(a.requires_grad or _is_wrapped(a) for a, c in zip(args, sig) if c == "t"):
                define(sig, tuple(_spec_key(a, c) for a, c in zip(args, sig)))
                if op.by_sig[sig][1][1]:  # seen returning (or writing) its argument: refused before it runs
                    raise NotImplementedError(_func_returns_arg(op.name))
                out = _Func.apply(op, sig, *args)[:-1]  # torch.func: an autograd.Function of its form
                return out[0] if op.by_sig[sig][1][0] else _many(out, op)
        if not torch.compiler.is_compiling():
            hit = fast.get(sig)
            if hit is not None:
                grad = _mode.grad = torch.is_grad_enabled()
                # nothing to record and no mode or subclass that must see the operator: the kernel
                # the dispatcher would pick, called directly (torch's Python op dispatch is ~10 us)
                plain = all(type(a) is torch.Tensor for a, c in zip(args, sig) if c == "t")
                if (native and plain and hit[1][0] is not None and not hit[1][1] and not hit[1][2]
                        and sig in op.checked
                        and not any(c in "LIF" for c in sig)):  # a Python function would get numpy arrays
                    direct[tuple(map(type, args))] = (sig, tuple(k for k, c in enumerate(sig) if c == "t"), hit[1])
                if "L" not in sig and _current_mode() is None and not _function_mode() and plain and not _transforms_active():
                    if grad and any(a.requires_grad for a, c in zip(args, sig) if c == "t"):
                        out = _eager(op, sig, args)  # the op's own autograd, minus its Python layers
                    else:
                        out = op.forward_impl(sig, args)
                else:
                    out = _run_registered(hit[0], args)
                    if out is None:  # an out= function
                        return None
                return out[0] if hit[1][0] else _many(out, op)
        if torch.compiler.is_compiling():
            overload = getattr(packet, ensure(sig)).default
            out = overload(*args)  # its fake kernel says whether the rule gives one output
            if out is None:  # an out= function
                if op.writes and op.shape_fn is not None and as_specs(op.name, op.shape_fn(*_specs(
                        tuple(_spec_key(a, c) for a, c in zip(args, sig)), sig)))[0]:
                    op.returns_args[0] = True  # later traces leave it out of the graph
                    raise RuntimeError(_mutates_returns(op.name))  # (its outputs would be None here)
                return None
            return out[0] if op.by_sig[sig][1][0] else _many(out, op)
        overload = getattr(packet, define(sig, tuple(_spec_key(a, c) for a, c in zip(args, sig)))[0]).default
        _mode.grad = torch.is_grad_enabled()
        fast[sig] = (overload, op.by_sig[sig][1])
        if any(a.is_neg() or a.is_conj() for a, c in zip(args, sig) if c == "t"):
            # torch's dispatcher would hand the kernel a resolved copy of a conjugate or negative view and
            # drop what the op writes into it unseen: the call goes the way later calls of the signature go,
            # where a write into it is refused (record)
            return route(*args)
        out = _run_registered(overload, args)
        if out is None:  # an out= function
            return None
        return out[0] if op.by_sig[sig][1][0] else _many(out, op)

    # no fake kernel: torch.compile runs this call eagerly (a graph break). torch.compiler.disable imports
    # torch._dynamo (seconds): it wraps `general` once something imports it, before anything is traced
    compiled = [general]
    outside = [general]  # the call left out of the graph

    def wrap() -> None:
        # the reasons are what fullgraph=True reports for the graph break
        outside[0] = _compiler_disable(general, f"{op.name} returns its argument (unchanged, a view of it, or "
                                       f"written in place with MarkDirty) or one tensor twice, which a compiled "
                                       f"graph cannot express: it runs eagerly")
        if op.shape_fn is None:
            compiled[0] = _compiler_disable(general, f"{op.name} has no shape rule (to_torch's shape_fn or a C++ "
                                            f"InferShape), so torch.compile cannot trace it: it runs eagerly")
    _when_dynamo(wrap)

    def call(*args: Any) -> Any:
        if _forward_ad._current_level >= 0:  # a dual level is open: refuse tangents, never drop them
            _refuse_tangents(op.name, args)
        if _is_compiling():  # no try block here: dynamo cannot break a graph inside one
            # an op seen returning its argument (MarkDirty, or unchanged) has no functional form for the
            # graph (torch's custom ops may not return inputs): it runs eagerly, a graph break
            return (outside[0] if op.returns_args[0] else compiled[0])(*args)
        try:
            # an eager call seen before, with nothing that must see the operator: the fewest steps
            hit = direct.get(tuple(map(type, args)))
            if (hit is not None and not hit[2][1] and not hit[2][2] and _current_mode() is None and not _function_mode()
                    and not _transforms_active()):
                sig, tpos, single = hit
                if _grad_enabled() and _any_requires_grad(args, tpos):
                    _mode.grad = True
                    out = _eager(op, sig, args)  # the op's own autograd, minus its Python layers
                else:
                    out = op.forward_direct(sig, tpos, args)
                return out[0] if single[0] else _many(out, op)
            if any(isinstance(a, (np.generic, list, tuple)) for a in args):  # np.int64(2) is 2, as to_jax
                args = tuple(plain_static(a) for a in args)
            return compiled[0](*args)
        except _Plain as p:  # a function returning None, a number or a string: its value as it is
            return _plain_value(p.value)

    entry = call
    if native and _torch_bridge.enabled():
        bridged: List[Any] = [None]  # the C++ bridge's Op, once the bridge is loaded

        def bridge_op(bridge: types.ModuleType) -> Any:
            # the Op, made once; it takes `entry`'s place in the namespace (an eager call then runs no
            # Python before the operator; torch.compile traces _traced_call, which calls `call`)
            if bridged[0] is None:
                with _define_lock:
                    if bridged[0] is None:
                        fast = bridge.Op(op.fn, call, op.checked, "cuda" in op.devices, op.shape_fn is not None)
                        _traced_calls(bridge)
                        fast.__dict__.update(bridged=bridged, torch_op=torch_op, __name__=op.name,
                                             __qualname__=op.name, __doc__=op.fn.__doc__)
                        bridged[0] = fast
                        if owner is not None and owner.__dict__.get(op.name) is entry:
                            setattr(owner, op.name, fast)
            return bridged[0]

        def entry(*args: Any) -> Any:
            # eager calls go to the C++ bridge (src/torch_bridge.cpp), which calls the operator itself
            # for plain CPU tensors and `call` for everything else: under a torch function or dispatch
            # mode (torch.export's, make_fx's) too, so only dynamo's tracing is asked here, the cheap way
            if not _dynamo_compiling():
                fast = bridged[0]
                if fast is not None:
                    return fast(*args)
                if not _is_compiling():
                    bridge = _torch_bridge.ready()  # starts its build; None until it is loaded
                    if bridge is None:
                        return call(*args)
                    return bridge_op(bridge)(*args)
            return call(*args)

        entry.bridged = bridged  # type: ignore[attr-defined]  # tests read the Op's fast_calls
        entry.bridge_op = bridge_op  # type: ignore[attr-defined]  # to_torch: the Op at once, bridge loaded
    def torch_op(*args: Any) -> Any:
        """The registered torch operator for a call with ``args`` (``op_handle``)."""
        args = tuple(plain_static(a) for a in args)
        sig = "".join([_code(op.name, k, a) for k, a in enumerate(args)])
        return getattr(packet, define(sig, tuple(_spec_key(a, c) for a, c in zip(args, sig)))[0]).default

    entry.torch_op = torch_op  # type: ignore[attr-defined]
    entry.__name__ = entry.__qualname__ = op.name
    entry.__doc__ = op.fn.__doc__
    return entry


_dynamo_waiting: List[Callable[[], None]] = []


class _DynamoWatch(importlib.abc.MetaPathFinder):
    """Runs ``_dynamo_waiting`` once ``torch._dynamo`` is imported (torch.compile imports it before it
    traces anything): to_torch then costs no import of torch._dynamo until something is compiled."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "torch._dynamo":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            run(module)
            while _dynamo_waiting:
                _dynamo_waiting.pop(0)()
        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _when_dynamo(fn: Callable[[], None]) -> None:
    """Call ``fn`` now if torch._dynamo is imported, else right after it is."""
    with _define_lock:
        if "torch._dynamo" in sys.modules and not any(isinstance(f, _DynamoWatch) for f in sys.meta_path):
            fn()
            return
        if not any(isinstance(f, _DynamoWatch) for f in sys.meta_path):
            sys.meta_path.insert(0, _DynamoWatch())
        _dynamo_waiting.append(fn)


def _refuse_tangents(name: str, args: Sequence[Any]) -> None:
    """An error if an argument is a dual tensor: operators have no forward-mode formula, and running
    one on the primal alone would return a result without the tangent the caller asked for."""
    for k, a in enumerate(args):
        for t in (a if isinstance(a, (list, tuple)) else [a]):
            if isinstance(t, torch.Tensor) and _forward_ad.unpack_dual(t).tangent is not None:
                raise NotImplementedError(
                    f"{name}: argument {k} is a dual tensor (torch.autograd.forward_ad), but opbuilder operators "
                    f"have no forward-mode derivative; use reverse mode (backward or torch.autograd.grad)")


def _specs(keys: Sequence[Any], sig: str) -> list:
    """The shape rule's arguments: each tensor's (shape, dtype name) as a ``Spec``."""
    def spec(k: Any) -> Spec:
        return Spec(k[0], _dtypes.to_dtype(k[1]).np)  # "bfloat16" is no numpy name
    return [spec(k) if c == "t" else [spec(e) for e in k] if c == "L" else k for k, c in zip(keys, sig)]


def _spec_key(a: Any, c: str) -> Any:
    """A constant stand-in for one argument: (shape, dtype name) for tensors, the value otherwise."""
    if c == "t":
        return (tuple(a.shape), str(a.dtype)[6:])
    if c == "L":
        return tuple((tuple(t.shape), str(t.dtype)[6:]) for t in a)
    return tuple(a) if c in "IFe" else a


class TorchOps(types.SimpleNamespace):
    """What ``to_torch`` returns: the module's functions as torch operators, by name.

    ``copy.deepcopy`` (of a model holding it) gives the same namespace: operators hold no state.
    Pickling it (``torch.save`` of such a model) stores how to make it again: the operator library's
    file and ``to_torch``'s arguments; ``torch.load`` loads that library (built, in the cache) again."""

    def __deepcopy__(self, memo: Dict[int, Any]) -> "TorchOps":
        return self

    def __copy__(self) -> "TorchOps":
        return self

    def __reduce__(self) -> Tuple[Any, ...]:
        source = self.__dict__.get("_source")
        if source is None:
            raise TypeError(f"the to_torch namespace {self._namespace} cannot be pickled: its module has no library "
                            f"file to load again (a module built in Python); save model.state_dict() instead, "
                            f"and make the namespace with to_torch when loading")
        return (_restore, source)


_restored: Dict[Tuple[Any, ...], TorchOps] = {}
_by_file: Dict[str, Any] = {}  # library file -> the module to_torch was given (one load per process)


def _restore(path: str, name: str, shape_fn: Optional[Dict[str, Callable]], backend: str,
             mutates: Optional[Dict[str, Sequence[int]]]) -> TorchOps:
    """A pickled ``TorchOps`` again: its library loaded (once per process) and wrapped (once per arguments)."""
    key = (path, backend, repr(sorted((shape_fn or {}).items())), repr(sorted((mutates or {}).items())))
    with _define_lock:
        hit = _restored.get(key)
        if hit is not None:
            return hit
        module = _by_file.get(path)
        if module is None:
            from pathlib import Path

            from ..importer import import_extension, preload, recorded_needs
            preload(recorded_needs(Path(path)))  # a nanobind module's runtime and core library, first
            module = import_extension(name, Path(path))
        ops = to_torch(module, shape_fn=shape_fn, backend=backend, mutates=mutates)
        _restored[key] = ops
        return ops


def op_handle(fn: Callable, *args: Any) -> Any:
    """The registered torch operator (an ``OpOverload``) of ``fn`` (a ``to_torch`` function) for a call
    with ``args``: what ``torch.library.opcheck`` and dispatch modes see. Defined here if no call has
    defined it yet. It returns a list of tensors (``fn`` itself returns one tensor or a tuple)."""
    get = getattr(fn, "torch_op", None)
    if get is None:
        raise TypeError(f"op_handle: {getattr(fn, '__name__', fn)!r} is not a function of a to_torch namespace")
    return get(*args)


# In the operators' namespace: bumped when their kernels or fake kernels change what they give (strides,
# outputs), so a graph inductor compiled and keeps in its on-disk cache under the old names is never
# reused with the new kernels (its key holds the operators' names, not their code).
_KERNELS = 2


def to_torch(module: Any, shape_fn: Optional[Dict[str, Callable]] = None, backend: str = "CPU",
             mutates: Optional[Dict[str, Sequence[int]]] = None) -> TorchOps:
    """``module``'s functions as PyTorch operators (torch tensors in and out, differentiable).

    ``shape_fn`` maps a function name to its shape rule (see ``Spec``); with one, the operator has a
    fake kernel and works under ``torch.compile(fullgraph=True)``. A function without one takes the
    rule of its ``<name>_infer_shape`` companion (a C++ ``InferShape``) when the module binds one. ``backend`` is the module's
    (``"CPU"`` or ``"GPU"``): which torch devices its arguments may live on. ``mutates`` maps a function
    name to the positions of the tensor arguments it writes in place (the ``out=`` pattern, e.g.
    ``{"add_out": [2]}``): torch's schema declares them (``Tensor(a!)``), so torch.compile keeps the
    write and ``opcheck`` passes. A function may return nothing (``void``): its call returns None.
    """
    if backend not in ("CPU", "GPU"):
        raise ValueError(f"to_torch: backend must be 'CPU' or 'GPU', got {backend!r}")
    funcs = module_functions(module)
    shape_fns = companion_shape_fns(module, funcs, check_shape_fns("to_torch", funcs, shape_fn))
    writes = _check_mutates(funcs, mutates)
    base = "".join(c if c.isalnum() else "_" for c in getattr(module, "__name__", "module").split(".")[-1])
    ns = f"opbuilder{_KERNELS}_{base}_{next(_namespaces)}"
    lib = torch.library.Library(ns, "FRAGMENT")
    devices = ("cpu",) if backend == "CPU" else ("cuda", "cpu")
    out = TorchOps(_library=lib, _namespace=ns)
    path = getattr(module, "__file__", None)
    if isinstance(path, str) and isinstance(getattr(module, "__name__", None), str):
        _by_file.setdefault(path, module)
        out._source = (path, module.__name__, shape_fn, backend, mutates)
    bridge = _torch_bridge.loaded()
    for name, fn in funcs.items():
        entry = _wrapper(_Op(ns, lib, name, fn, shape_fns.get(name), devices, writes.get(name, ())), out)
        setattr(out, name, entry)
        if bridge is not None and hasattr(entry, "bridge_op"):  # the bridge is loaded: its Op at once
            entry.bridge_op(bridge)
    return out


def _check_mutates(funcs: Dict[str, Callable], mutates: Any) -> Dict[str, Tuple[int, ...]]:
    """``mutates`` checked: function names of the module to non-negative argument positions."""
    if mutates is None:
        return {}
    if not isinstance(mutates, dict):
        raise TypeError(f"to_torch: mutates must be a dict from function name to argument positions, got "
                        f"{type(mutates).__name__}")
    out = {}
    for name, pos in mutates.items():
        if name not in funcs:
            raise ValueError(f"to_torch: mutates names {name!r}, which the module does not define "
                             f"(it has {', '.join(sorted(funcs))})")
        if (not isinstance(pos, (list, tuple)) or not pos
                or not all(isinstance(k, int) and not isinstance(k, bool) and k >= 0 for k in pos)):
            raise TypeError(f"to_torch: mutates[{name!r}] must be a non-empty list of argument positions "
                            f"(ints >= 0), got {pos!r}")
        out[name] = tuple(sorted(set(pos)))
    return out
