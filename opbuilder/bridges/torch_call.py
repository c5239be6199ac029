"""One runtime call under a ``to_torch`` operator, as every route of the torch bridge sees it.

What interop_torch.py (the operators, their routes through torch, their autograd) and torch_writes.py
(the writes a call makes into its torch arguments) both build on: the tensors crossing without copies
(torch -> runtime: ``_to_runtime``; runtime -> torch: ``_to_torch``, ``_from_numpy``), the call's record
(``_Call``, its tensors in ``_flat`` order), the thread's state of the call in progress (``_mode``), and
the input gradients the call gives torch (``_input_grads``) under torch's rules for a second backward
(``_once``, ``_second_time_mark``, ``_save_mark``). It imports neither module, and torch_writes.py does
not import interop_torch.py: the dependencies point one way.
"""
from __future__ import annotations

import itertools
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

import runtime as _rt
from runtime import call_rules as _rules
from runtime import dtypes as _dtypes
from runtime.dlpack_host import torch_array as _torch_array
from runtime.tensor import Tensor as _Tensor

# torch's grad mode at the user's call (the kernel itself runs with grad off, below autograd), and the
# registered kernel's last call for its setup_context (same thread, right after it: torch.library's order)
_mode = threading.local()
# a torch.func transform (grad, vjp, vmap) in force: its tensors are wrappers; the registered operator sees them
# (reads the thread's dispatch keys; peek_interpreter_stack would copy functorch's whole thread state)
_transforms_active = torch._C._are_functorch_transforms_active
_is_compiling = torch.compiler.is_compiling


# numpy's dtype of a runtime array -> the torch dtype of the same elements
_TORCH_DT = {_dtypes.to_dtype(n).np: getattr(torch, n) for n in (
    "float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
    "uint32", "uint64", "bool", "complex64", "complex128")}


def _view_over(t: torch.Tensor, arr: Any) -> Optional[torch.Tensor]:
    """torch's view of ``t`` over exactly the elements of ``arr`` (a runtime array over ``t``'s memory):
    ``t.as_strided(...)``; with negative strides, which torch has no view for, the flip of such a view
    (torch's x.flip(0): a copy, its gradient to ``t``). None where ``arr`` is no host array of ``t``'s
    dtype on its element grid, or reaches outside ``t``'s storage."""
    if type(arr) is not np.ndarray or arr.size == 0 or _TORCH_DT.get(arr.dtype) != t.dtype:
        return None
    item = arr.itemsize
    off = arr.__array_interface__["data"][0] - t.data_ptr()
    if off % item or any(st % item for st in arr.strides):
        return None
    steps = [st // item for st in arr.strides]
    back = [d for d, (n, st) in enumerate(zip(arr.shape, steps)) if st < 0 and n > 1]
    first = t.storage_offset() + off // item + sum((arr.shape[d] - 1) * steps[d] for d in back)
    try:
        view = t.as_strided(arr.shape, [abs(st) for st in steps], first)
    except RuntimeError:  # outside t's storage: not a view of it
        return None
    return view.flip(back) if back else view


class _Call:
    """One runtime call: the runtime inputs needing grad (``index``: their flat tensor positions), its
    runtime outputs, and how they relate to the torch arguments: ``alias[j]``, the flat position of the
    argument output ``j`` is (returned unchanged) or -1; ``dirty``, the flat positions of arguments the op
    wrote (MarkDirty); ``recorded``, whether a runtime graph was recorded; ``nflat``, the tensor count."""
    __slots__ = ("inputs", "index", "outputs", "alias", "dirty", "recorded", "nflat", "vcs", "written", "late",
                 "asis", "__weakref__")

    def __init__(self, inputs: List[Any], index: List[int], outputs: List[Any], alias: Optional[List[int]] = None,
                 dirty: Sequence[int] = (), recorded: bool = True, nflat: int = 0, vcs: Sequence[Any] = (),
                 written: Optional[Dict[int, Any]] = None, late: Tuple[int, ...] = ()) -> None:
        self.inputs, self.index, self.outputs, self.vcs = inputs, index, outputs, vcs
        self.alias = [-1] * len(outputs) if alias is None else alias
        self.dirty, self.recorded, self.nflat = frozenset(dirty), recorded, nflat
        # flat position -> the runtime tensor of an argument the op wrote and did not return, whose history
        # the write made (an inner Function's MarkDirty): torch's history of it becomes the call's (_Rebase)
        self.written = written or {}
        # the flat position of a view the op wrote and returned, whose history _Rebase gives (in ``written``)
        # instead of the call's node marking it dirty: the call returns that argument after (_rebasing)
        self.late = late
        # (output, flat position, None) of each argument returned as it came (the runtime tensor the call was
        # given, no Function around it): the caller gets its own tensor back after the call, as torch's
        # `return x`; (output, flat position, array) of a Tensor the function built over an argument's
        # memory: a view of that argument made after the call (_returned_arguments)
        self.asis: Tuple[Tuple[int, int, Any], ...] = ()


class _Keep:
    """An array's interface plus the call it came from: the base of the array torch gets, so the
    runtime graph lives exactly as long as the output's memory."""
    __slots__ = ("__array_interface__", "arr", "call", "__weakref__")

    def __init__(self, arr: np.ndarray, call: _Call) -> None:
        self.__array_interface__ = arr.__array_interface__
        self.arr, self.call = arr, call


def _flat(args: Sequence[Any], sig: str) -> List[Any]:
    """The tensor arguments (torch's, or the runtime's made of them), lists flattened: the order of
    ``_Call``'s flat positions."""
    return [t for a, c in zip(args, sig) if c in "tL" for t in ([a] if c == "t" else a)]


# torch dtypes whose numpy view the runtime takes as it is (the fast path of _to_runtime)
_PLAIN = frozenset(getattr(torch, n) for n in ("float16", "float32", "float64", "int8", "int16", "int32", "int64",
                                              "uint8", "uint16", "uint32", "uint64", "bool", "complex64",
                                              "complex128"))


def _to_runtime(who: str, k: int, t: torch.Tensor, devices: Tuple[str, ...]) -> Any:
    if t.is_cpu and t.dtype in _PLAIN:
        try:
            return _Tensor._from_array(t.detach().numpy())
        except RuntimeError:  # a conjugate or negative view: numpy has none, torch resolves it (a copy)
            return _Tensor._from_array(t.detach().resolve_conj().resolve_neg().numpy())
    dev = t.device.type
    if dev not in devices:
        if _is_fake(t):
            raise ValueError(f"{who}: argument {k} is a fake tensor (torch's FakeTensorMode: export, AOT tracing, "
                             f"shape propagation), which has no data to run it on; a shape rule gives its outputs "
                             f"without a run: to_torch's shape_fn for {who!r}, or a C++ InferShape")
        raise ValueError(f"{who}: argument {k} is a {dev} tensor; this operator runs on "
                         f"{' and '.join(devices)} tensors (move it with .to('{devices[0]}'))")
    try:
        if dev == "cpu":  # Tensor.numpy() shares memory and is several times cheaper than DLPack
            arr = _torch_array(t.detach())  # bfloat16 too
            _dtypes.from_numpy_dtype(arr.dtype)
            return _Tensor._from_array(arr)
        return _rt.from_dlpack(t.detach())
    except (TypeError, BufferError, RuntimeError) as e:
        raise TypeError(f"{who}: argument {k} has dtype {t.dtype}, which opbuilder's runtime does not support "
                        f"({e})") from None


def _is_fake(t: torch.Tensor) -> bool:
    """Is ``t`` a FakeTensor (imported here only: an error's path)?"""
    from torch._subclasses.fake_tensor import is_fake
    return bool(is_fake(t))


def _c_order(arr: np.ndarray) -> np.ndarray:
    """``arr`` in C order, copied only if it is not; a 0-d array stays 0-d (``np.ascontiguousarray``
    makes it 1-d: a 0-d view's gradient of shape [1] fails torch's backward)."""
    return arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)


def _from_numpy(arr: np.ndarray) -> torch.Tensor:
    """``torch.from_numpy``, bfloat16 included (through a uint16 view of the same memory); a view
    with negative strides, which torch cannot describe, as a contiguous copy."""
    try:
        return torch.from_numpy(arr)
    except TypeError:
        if arr.dtype != _dtypes.bfloat16.np:
            raise
        return torch.from_numpy(arr.view(np.uint16)).view(torch.bfloat16)
    except ValueError:
        if not any(s < 0 for s in arr.strides):
            raise
        return _from_numpy(np.ascontiguousarray(arr))


def _to_torch(out: Any, call: Optional[_Call]) -> torch.Tensor:
    arr = out._data
    if not isinstance(arr, np.ndarray):  # a CUDA array (CuPy): DLPack shares it
        return torch.from_dlpack(arr)
    if call is not None:
        bf16 = arr.dtype.kind == "V"  # the interface keeps bfloat16 only as raw bytes: keep uint16
        arr = np.asarray(_Keep(arr.view(np.uint16) if bf16 else arr, call))
        if bf16:
            return torch.from_numpy(arr).view(torch.bfloat16)
    return _from_numpy(arr)


def _input_grads(call: _Call, pairs: Sequence[Tuple[Any, Any]], retain: bool) -> List[Optional[torch.Tensor]]:
    """The gradients of the call's flat tensor arguments (None for none) from runtime (tensor, gradient)
    ``pairs`` of its graph (outputs, or arguments it wrote), as torch tensors."""
    res: List[Optional[torch.Tensor]] = [None] * call.nflat
    if pairs and call.inputs:
        gs = _rt.autograd.grad([o for o, _ in pairs], call.inputs, [g for _, g in pairs], retain_graph=retain,
                               allow_unused=True)
        for i, g in zip(call.index, gs):
            if g is not None:
                res[i] = torch.from_dlpack(g) if not isinstance(g._data, np.ndarray) else _from_numpy(_c_order(g._data))
    return res


def _once(name: str, res: List[Optional[torch.Tensor]], grads: Sequence[Any], inputs_need_grad: bool,
          inputs: Sequence[Any] = ()) -> List[Optional[torch.Tensor]]:
    """Input gradients ``res`` of a backward run with create_graph=True: a gradient of them is one named
    error (torch's once-differentiable rule, runtime/call_rules.py's message), never a silent zero. The
    error's node leads to the op's ``inputs`` that require grad and to the incoming ``grads`` that do, so
    differentiating the result with respect to any of them reaches it (and raises)."""
    if not torch.is_grad_enabled() or _is_compiling() or _transforms_active():  # torch.func: _Func's
        return res
    if not inputs_need_grad and not any(isinstance(g, torch.Tensor) and g.requires_grad for g in grads):
        return res
    pos = [i for i, r in enumerate(res) if r is not None]
    if not pos:
        return res
    flat = itertools.chain.from_iterable(a if isinstance(a, (list, tuple)) else (a,) for a in inputs)
    links = [t for t in itertools.chain(flat, grads) if isinstance(t, torch.Tensor) and t.requires_grad]
    err = torch._C._functions.DelayedError(_rules.double_backward_message(name), len(pos) + len(links))
    wrapped = err(*[res[i].detach().requires_grad_() for i in pos], *links)
    out = list(res)
    for i, w in zip(pos, wrapped if isinstance(wrapped, (list, tuple)) else (wrapped,)):
        out[i] = w
    return out


_MARK: List[torch.Tensor] = []


def _second_time_mark() -> torch.Tensor:
    """An empty tensor a registered-path node saves, so that torch's own rule for a second backward holds."""
    if not _MARK:
        _MARK.append(torch.empty(0))
    return _MARK[0]


_top_hooks = torch._C._autograd._top_saved_tensors_default_hooks


def _save_mark(ctx: Any) -> None:
    """``ctx`` saves the second-backward mark, unless saved-tensor hooks are in force: they would see it
    (pack it, count it), and the C++ bridge's node saves no such tensor, so a non-reentrant checkpoint whose
    forward took this path and whose recomputation took the bridge (or the other way) counted two numbers
    of saved tensors and failed. Under hooks a second backward is then not refused here (the runtime's
    graph is kept for it)."""
    if _top_hooks(False) is None:
        ctx.save_for_backward(_second_time_mark())
