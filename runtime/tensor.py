"""``Tensor`` and ``Parameter``: numpy arrays that remember how they were made.

A tensor is a thin object over one numpy array (``_data``). Everything the
autograd engine needs lives in a few instance attributes whose class-level
defaults keep a fresh tensor cheap: ``requires_grad``, ``_grad`` (``grad``), ``_node``
(the node that produced it, ``None`` for leaves), ``_out_index`` (which output
of that node) and ``_version`` (bumped by in-place changes). The C++ side
(include/opbuilder/detail/runtime_bridge.h) reads and writes the same names
(runtime/_native.py lists them).

``_base`` is, for a view an op made (a slice, a reshape, a transpose), the
tensor whose memory it views (the first tensor of a chain of views), so an
in-place write into the view can rebase the base's history
(runtime/call_rules.py ``rebase_view``); ``None`` for every other tensor. It
is held weakly: a view keeps its base's memory alive, not the base's object
(nobody can read the gradient of a base that is gone). A view also keeps
``_view_version``, the version of its memory when its history was set: a
recorded in-place write into its base (or into another view of it) moves the
version on, and the view's history is made anew from the base's when it is
next an op's input (runtime/call_rules.py ``refresh_view``), as torch does.

``_version`` is the value of a counter shared by every tensor over the same
memory (views, ``detach()``, ``from_numpy`` of one array), as in PyTorch, so a
write through any of them is seen by the version checks of all of them. A
tensor gets its own counter when it is first written or viewed; until then it
reads a shared zero.

``Tensor(data)`` and ``Parameter(data)`` copy an array they are given;
``from_numpy`` and ``as_tensor`` share its memory, and ops wrap their fresh
results without copying.

This module imports no op: the operators (``t + u``, ``t[i] = v``), the
method forms of ops (``t.sum()``, ``t.to(...)``) and ``backward`` are
attached to ``Tensor`` by runtime/ops/tensor_methods.py, which
``import runtime`` loads, so ops depend on tensors and never the reverse.
"""
from __future__ import annotations

import copy as _copy
from typing import Any, Dict, Optional, Tuple

import numpy as np

from . import context as _context
from . import device as _device
from . import dtypes as _dt
from .versions import UNWRITTEN, Version, owner_counter, rebind, set_version, share_version, version_of

# How many jit traces record, in all threads (capture.py's Tracer keeps it): while 0, a read of ``.grad``
# costs one list read more.
_TRACING = [0]


_WRITTEN = object()  # what a .grad set while tracing is noted with


def _note_grad_read(t: "Tensor", wrote: bool = False) -> None:
    """Tell this thread's recording trace, if any, that ``t.grad`` was read (or, ``wrote``, is about to be
    set), and its value then (runtime/jit/function.py: a value that changed by the trace's end is a
    rebind; a write never is that value)."""
    from .autograd.grad_mode import _state
    w = _state.watch
    if w is not None:
        w.note_grad(t, _WRITTEN if wrote else t._grad)


__all__ = ["Tensor", "Parameter", "as_tensor", "from_numpy"]

_new = object.__new__
# a tensor's history, view relation and write counter: this process's, never copied or pickled
_GRAPH_STATE = frozenset({"_node", "_out_index", "_vc", "_view_version", "_view_no_grad"})


def _check_grad_assignment(t: "Tensor", value: Any) -> None:
    """torch's checks of ``t.grad = value``: a gradient of another shape, dtype or device would be wrong
    for every later backward and optimizer step, so it is refused here, where it is set."""
    if not isinstance(value, Tensor):
        raise TypeError(f"assigned grad expected to be a Tensor or None but got grad of type {type(value).__name__}")
    if value is t:
        raise RuntimeError("can't assign a tensor as its own grad")
    if value._data.shape != t._data.shape:
        raise RuntimeError(f"attempting to assign a gradient of shape {list(value._data.shape)} to a tensor of shape "
                           f"{list(t._data.shape)}; they must be the same")
    if value._data.dtype != t._data.dtype:
        raise RuntimeError(f"attempting to assign a gradient of dtype {value.dtype} to a tensor of dtype {t.dtype}; "
                           f"they must be the same")
    if value.device != t.device:
        raise RuntimeError(f"attempting to assign a gradient on {value.device} to a tensor on {t.device}; they must "
                           f"be on the same device")


def _deepcopy_array(arr: Any, memo: Dict[int, Any]) -> Any:
    """A copy of ``arr`` for ``copy.deepcopy``: arrays over one memory, copied in one deepcopy, are
    views of one copy of that memory (as torch copies a storage once). numpy arrays over a contiguous
    owner; anything else is copied alone."""
    owner = arr
    while isinstance(owner.base, np.ndarray):
        owner = owner.base
    if type(arr) is not np.ndarray or not (owner.flags.c_contiguous or owner.flags.f_contiguous):
        return _copy.deepcopy(arr, memo)
    key = ("opbuilder.memory", id(owner))
    twin = memo.get(key)
    if twin is None:
        twin = memo[key] = owner.copy(order="A")
        memo.setdefault(id(memo), []).append(owner)  # keeps the key's id unique while copying
    if arr is owner:
        return twin
    offset = arr.__array_interface__["data"][0] - owner.__array_interface__["data"][0]
    flat = twin.reshape(-1, order="A").view(np.uint8)
    return np.ndarray(arr.shape, arr.dtype, buffer=flat, offset=offset, strides=arr.strides)


def _infer_array(data: Any, dtype: Optional[_dt.DType], device: Optional[str] = None, copy: bool = False) -> Any:
    """The array for ``data`` on ``device`` (a parsed name; None: the data's own device if it
    is a GPU array, else the context's); Python floats default to float32 (as MindSpore).
    ``copy``: never the caller's memory (a Tensor's constructor); else shared where it can be."""
    if isinstance(data, Tensor):
        data = data._data
    if _device.is_device_array(data):  # GPU data: CuPy, or anything with __cuda_array_interface__
        return _device_array(data, dtype, device, copy)
    if dtype is not None:
        arr = np.asarray(data, dtype=dtype.np)
    else:
        arr = np.asarray(data)
        if arr.dtype == np.float64 and not isinstance(data, (np.ndarray, np.generic)):
            arr = arr.astype(np.float32)
    if not arr.dtype.isnative:  # big-endian data (from a file, say): the same values in this machine's order
        arr = arr.astype(arr.dtype.newbyteorder("="))
    _dt.from_numpy_dtype(arr.dtype)  # TypeError for object, str, float8 ...
    if device is None:
        device = _context.default_device()
    if device != _device.CPU:
        return _device.to_device(arr, device)  # a copy onto the device
    if copy and (arr is data or arr.base is not None):  # still the caller's memory (an array, a buffer)
        arr = arr.copy()
    return arr


def _device_array(data: Any, dtype: Optional[_dt.DType], device: Optional[str], copy: bool = False) -> Any:
    """A CuPy array for GPU ``data`` (zero-copy when dtype and device already fit, unless ``copy``)."""
    cp = _device.array_module(None)
    arr = cp.asarray(data) if dtype is None else cp.asarray(data, dtype=dtype.np)
    _dt.from_numpy_dtype(arr.dtype)
    if device is not None and _device.device_of(arr) != device:
        return _device.to_device(arr, device)  # a copy onto the other device
    if copy and (arr is data or arr.base is not None or not isinstance(data, cp.ndarray)):
        arr = arr.copy()
    return arr


def _format_value(arr: np.ndarray) -> str:
    if arr.ndim == 0:
        if arr.dtype.kind == "f" and arr.dtype.itemsize <= 8:  # in its own precision: 0.1, not 0.10000000149...
            return np.format_float_positional(arr[()], trim="-")
        if arr.dtype.kind in "cV":  # complex, bfloat16: numpy's own form of the scalar, in its precision
            return str(arr[()])
        return str(arr.item())
    return np.array2string(arr, separator=", ")


class Tensor:
    """An n-dimensional array on the CPU that can take part in autograd.

    ``Tensor(data, dtype=None, device=None)``: ``data`` is anything numpy
    accepts (or a CuPy array); Python floats become float32 unless ``dtype``
    says otherwise. The data is copied (as by ``torch.tensor``), so a later
    change to the caller's array does not reach the tensor; ``from_numpy``
    shares it. ``device``: ``"CPU"``, ``"GPU"``, ``"GPU:N"``, ``"cuda"``,
    ``"cuda:N"``; None keeps a GPU array where it is and puts anything else on
    the context's device (``set_context(device_target=...)``).
    """

    # numpy defers ``ndarray * Tensor`` to ``Tensor.__rmul__``
    __array_priority__ = 1000
    # _base_ref and _data are slots, so native code reads them at fixed offsets (call_rules.h BaseRefOf,
    # runtime_bridge.h DataOf) on every Function<T> call instead of an attribute lookup, and a tensor an
    # op returns needs no instance dict. Every way a Tensor is made sets both (_base_ref None: no view)
    __slots__ = ("_base_ref", "_data", "__dict__", "__weakref__")

    requires_grad: bool = False
    _grad: Optional["Tensor"] = None  # .grad's value: the engine sets it here, past the assignment's checks
    _node = None
    _out_index: int = 0
    _vc: Version = UNWRITTEN
    # _base_ref (the slot above): a weak reference to the tensor whose memory this view (slice, reshape...)
    # is a part of, or None
    _view_version: int = 0  # a view's: its memory's version when its history (_node) was set (call_rules.refresh_view)
    _view_no_grad: bool = False  # a view's: made while grad mode was off from a base that requires grad

    @property
    def _base(self) -> Optional["Tensor"]:
        """The tensor this view (made by an op) is a part of, while it lives; else None."""
        ref = self._base_ref
        return None if ref is None else ref()
    _version = property(version_of, set_version,
                        doc="The write count of this tensor's memory (shared with its views; see the module doc).")

    def __init__(self, data: Any = None, dtype: Any = None, device: Optional[str] = None, *,
                 requires_grad: bool = False, input_data: Any = None) -> None:
        self._base_ref = None
        if data is None:
            data = input_data  # MindSpore's keyword
        if data is None:
            raise TypeError("Tensor() needs data (a number, a nested list or a numpy array)")
        self._data = _infer_array(data, None if dtype is None else _dt.to_dtype(dtype),
                                  None if device is None else _device.parse_device(device), copy=True)
        if requires_grad:
            self.requires_grad_(True)

    @staticmethod
    def _from_array(arr: np.ndarray) -> "Tensor":
        """Wrap an ndarray without checks (the fast path used by ops)."""
        t = _new(Tensor)
        t._base_ref = None
        t._data = arr
        return t

    @property
    def grad(self) -> Optional["Tensor"]:
        """The gradient ``backward()`` accumulated into this leaf (None until then)."""
        if _TRACING[0]:  # a jit trace records somewhere: it is told the read (the graph would hold the value)
            _note_grad_read(self)
        return self._grad

    @grad.setter
    def grad(self, value: Optional["Tensor"]) -> None:
        """As torch: None, or a Tensor of this tensor's shape, dtype and device, not this tensor itself."""
        if value is not None:
            _check_grad_assignment(self, value)
        if _TRACING[0]:  # a write a replay would not do: the trace is told (runtime/jit/function.py)
            _note_grad_read(self, wrote=True)
        self._grad = value

    @grad.deleter
    def grad(self) -> None:
        if _TRACING[0]:
            _note_grad_read(self, wrote=True)
        self._grad = None

    def __setstate__(self, state: Any) -> None:
        """Restore from pickle or copy: ``state`` is (instance dict, slots). A pickle made while ``_data``
        or ``_base_ref`` was no slot holds it in the dict part: it goes into its slot (an instance dict
        entry would be hidden by the slot, and every use would raise AttributeError)."""
        d, slots = state if isinstance(state, tuple) else (state, None)
        d = dict(d or {})
        if "grad" in d:  # pickled before .grad was a property: its value is kept in _grad now
            d["_grad"] = d.pop("grad")
        self._base_ref = d.pop("_base_ref", None)
        if "_data" in d:
            self._data = d.pop("_data")
        self.__dict__.update(d)
        for k, v in (slots or {}).items():
            setattr(self, k, v)

    def __getstate__(self) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        """What pickle keeps: the values (a view's own elements), ``requires_grad``, ``grad`` and a
        Parameter's fields. The history, the view relation (a weak reference) and the write counter
        are this process's: the loaded tensor is a leaf with memory of its own, as torch's."""
        d = {k: v for k, v in self.__dict__.items() if k not in _GRAPH_STATE}
        return d, {"_data": self._data}

    def __copy__(self) -> "Tensor":
        """A leaf over the same memory (as torch's ``copy.copy``), counting writes on the same counter,
        so a write through either is seen by the version checks of both."""
        new = _new(type(self))
        new._base_ref = None
        new._data = self._data
        share_version(new, self)
        # as torch, the copy has no .grad of its own yet (backward adds into .grad in place: sharing it
        # would let a backward through the copy change the original's)
        new.__dict__.update((k, v) for k, v in self.__dict__.items() if k not in _GRAPH_STATE and k != "_grad")
        return new

    def __deepcopy__(self, memo: Dict[int, Any]) -> "Tensor":
        """A new leaf with new memory, as torch's: only a leaf may be copied (a copy of a result cannot
        keep its history). Tensors copied together that shared memory share the copied memory (a
        Parameter and a view of it, in one model), each a leaf that counts writes on one counter."""
        if self._node is not None:
            raise RuntimeError("Only Tensors created explicitly by the user (graph leaves) support the "
                               "deepcopy protocol at the moment (copy.deepcopy of a tensor with history; "
                               "detach() it first)")
        new = _new(type(self))
        memo[id(self)] = new
        new._base_ref = None
        new._data = _deepcopy_array(self._data, memo)
        if self._vc is not UNWRITTEN:
            key = ("opbuilder.version", id(self._vc))
            vc = memo.get(key)
            if vc is None:
                vc = memo[key] = Version(self._vc.value)
                memo.setdefault(id(memo), []).append(self._vc)  # keeps the key's id unique while copying
            new._vc = vc
        for k, v in self.__dict__.items():
            if k not in _GRAPH_STATE:
                new.__dict__[k] = _copy.deepcopy(v, memo)
        return new

    # ---- properties -------------------------------------------------
    @property
    def shape(self) -> Tuple[int, ...]:
        return self._data.shape

    @property
    def dtype(self) -> _dt.DType:
        return _dt.from_numpy_dtype(self._data.dtype)

    @property
    def ndim(self) -> int:
        return self._data.ndim

    @property
    def size(self) -> int:
        return self._data.size

    @property
    def device(self) -> str:
        """``"CPU"`` or ``"GPU:N"``: where the data lives."""
        return _device.device_of(self._data)

    @property
    def is_leaf(self) -> bool:
        return self._node is None

    def _host(self) -> np.ndarray:
        d = self._data
        return d if isinstance(d, np.ndarray) else _device.to_device(d, _device.CPU)

    def numpy(self) -> np.ndarray:
        return self.asnumpy()

    # ---- interop: DLPack (zero-copy, CPU and GPU) and CUDA's array interface ----
    def __dlpack__(self, *, stream: Any = None, max_version: Optional[Tuple[int, int]] = None,
                   dl_device: Optional[Tuple[int, int]] = None, copy: Optional[bool] = None) -> Any:
        """A DLPack capsule over this tensor's memory, as the array API standard says: its array's
        own ``__dlpack__`` (numpy's, or CuPy's given only the arguments the consumer set); a host
        bfloat16 tensor, which numpy cannot export, through runtime/dlpack_export.py. A host tensor
        has no streams: ``stream`` other than None is a ValueError."""
        if self.requires_grad:  # torch's rule: a consumer's write would bypass autograd's checks
            raise BufferError("__dlpack__: a tensor that requires grad cannot be exported (another library's "
                              "writes to it would go unseen by autograd); export t.detach()")
        d = self._data
        if isinstance(d, np.ndarray):
            if any(s < 0 for s in d.strides):  # torch aborts the process on such a capsule; JAX refuses it
                raise BufferError(f"__dlpack__: a view with negative strides {d.strides} (x[::-1]) cannot be "
                                  f"exported: consumers (torch) mishandle them; export a copy "
                                  f"(Tensor(t.asnumpy().copy()))")
            if stream is not None:  # said here: numpy's own error changed type (RuntimeError, ValueError in 2.5)
                raise ValueError(f"__dlpack__: a CPU tensor has no streams: stream must be None, got {stream!r}")
            if d.dtype.kind == "V":  # ml_dtypes' bfloat16 is numpy's "V" kind
                from .dlpack_export import export
                return export(d, stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)
            return d.__dlpack__(stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)
        given = {"stream": stream, "max_version": max_version, "dl_device": dl_device, "copy": copy}
        return d.__dlpack__(**{k: v for k, v in given.items() if v is not None})

    def __dlpack_device__(self) -> Tuple[int, int]:
        """(DLPack device type, index): (1, 0) for the CPU, (2, n) for CUDA device n."""
        return self._data.__dlpack_device__()

    @property
    def __cuda_array_interface__(self) -> dict:
        d = self._data
        if isinstance(d, np.ndarray):
            raise AttributeError("a CPU tensor has no __cuda_array_interface__ (use __dlpack__ or asnumpy())")
        return d.__cuda_array_interface__

    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        """Mark a leaf as needing gradients; only floating tensors can."""
        if requires_grad and self._data.dtype.kind not in _dt.GRAD_KINDS:
            raise TypeError(f"only floating-point and complex tensors can require gradients, got dtype {self.dtype}")
        if not requires_grad and self._node is not None:
            raise RuntimeError("requires_grad can only be turned off on a leaf; use detach()")
        self.requires_grad = bool(requires_grad)
        return self

    def detach(self) -> "Tensor":
        """A new leaf sharing this tensor's data and version counter, outside the graph (ops/tensor_methods.py
        puts the form a jit trace records in its place; ``detached`` is this one)."""
        return detached(self)

    # ---- printing ---------------------------------------------------
    def __repr__(self) -> str:
        return f"Tensor(shape={list(self._data.shape)}, dtype={self.dtype}, value= {_format_value(self._host())})"

    def __str__(self) -> str:  # printing inside a trace shows the traced values and does not stop it
        return str(self._host())

    # ---- python protocol --------------------------------------------
    def __len__(self) -> int:
        if self._data.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return len(self._data)

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    __hash__ = object.__hash__


def detached(t: Tensor) -> Tensor:
    """``t.detach()`` as no jit trace sees it (the runtime's own use, inside ops and the tracer)."""
    d = _new(Tensor)
    d._base_ref = None
    d._data = t._data
    share_version(d, t)
    return d


class Parameter(Tensor):
    """A tensor a ``Cell`` owns and trains; requires grad by default."""

    def __init__(self, data: Any = None, name: Optional[str] = None, requires_grad: bool = True, *,
                 default_input: Any = None) -> None:
        super().__init__(data if data is not None else default_input)  # default_input: MindSpore's keyword
        self.name = name
        self.requires_grad_(requires_grad)

    def _set_data(self, data: Any, slice_shape: bool = False) -> "Parameter":
        """Replace the values, bumping the version like an in-place op.

        The shape must stay the same unless ``slice_shape=True`` (as MindSpore's);
        the values are converted to the Parameter's dtype when numpy can do it
        without changing their kind (float64 -> float32, int -> float), never
        float -> int, which would truncate them silently. The data is copied (as by the constructor)."""
        who = f"Parameter {self.name!r}" if self.name else "Parameter"
        src = data._data if isinstance(data, Tensor) else data
        src_dtype = getattr(src, "dtype", None)
        if not isinstance(src_dtype, np.dtype):  # a list, a number, another library's tensor (torch.float32)
            src_dtype = np.asarray(src).dtype
        ints = src_dtype.kind in "iu" and self._data.dtype.kind in "iu"  # any, if the values fit (_check_narrowed)
        if not np.can_cast(src_dtype, self._data.dtype, casting="same_kind") and src_dtype != np.bool_ and not ints:
            raise TypeError(f"set_data: {who} is {self.dtype}, and data of dtype {src_dtype} would lose its values "
                            f"when converted; convert it yourself (astype) if that is meant")
        _check_narrowed(f"{who} is {self.dtype}", src, np.dtype(self._data.dtype))
        arr = _infer_array(data, self.dtype, self.device, copy=True)  # never the caller's buffer
        if arr.shape != self._data.shape and not slice_shape:
            raise ValueError(f"set_data: {who} has shape {tuple(self._data.shape)}, the new data {tuple(arr.shape)}; "
                             f"pass slice_shape=True to change the shape")
        rebind(self, arr)  # its old views keep the old memory and counter
        self._version = self._version + 1
        return self

    def __repr__(self) -> str:
        return (f"Parameter (name={self.name}, shape={tuple(self._data.shape)}, dtype={self.dtype}, "
                f"requires_grad={self.requires_grad})")


def type_label(value: Any) -> str:
    """``value``'s type for a message: ``float``, ``numpy.ndarray``, ``torch.Tensor`` (a builtin by its name,
    another by its module, so torch's Tensor is not read as the runtime's)."""
    t = type(value)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _check_narrowed(who: str, src: Any, dtype: np.dtype) -> None:
    """set_data's conversion to ``dtype`` keeps the values: an integer out of its range (300 into int8 wrapped
    to 44, -1 into uint8) or a finite float out of its range (1e300 into float32 became inf) is a ValueError;
    rounding is not. (Data numpy cannot read here, device memory, is left to the conversion.)"""
    if dtype.kind not in "iuf":
        return
    try:
        s = np.asarray(src)
    except Exception:  # noqa: BLE001
        return
    if s.dtype.kind not in "biuf" or s.dtype == dtype:
        return
    with np.errstate(all="ignore"):
        if dtype.kind in "iu":
            v = s.astype(np.float64) if s.dtype.kind == "f" else s
            info = np.iinfo(dtype)
            lost = (v < info.min) | (v > info.max)
        else:
            lost = np.isinf(s.astype(dtype)) & np.isfinite(s)
    if np.any(lost):
        raise ValueError(f"set_data: {who}, and the data of dtype {s.dtype} holds values it cannot hold "
                         f"({s[lost].flat[0]!r} among them); convert it yourself (astype) if that is meant")


def as_tensor(value: Any, like: Optional[Tensor] = None) -> Tensor:
    """``value`` as a Tensor; a Python number takes ``like``'s dtype (float32 for a
    float next to an integer tensor), so ``Tensor(1.0, float32) * 2`` stays float32."""
    if isinstance(value, Tensor):
        return value
    if type(value) is float and like is not None:  # the common case: a float next to a float CPU tensor
        d = like._data
        if type(d) is np.ndarray and d.dtype.kind == "f":
            t = _new(Tensor)
            t._base_ref = None
            t._data = np.asarray(value, d.dtype)
            return t
    if like is not None and isinstance(value, (bool, int, float, complex)) and not isinstance(value, np.generic):
        dt = like._data.dtype
        if isinstance(value, complex) and dt.kind != "c":  # complex64 unless like is float64
            dt = np.dtype(np.complex128 if dt == np.float64 else np.complex64)
        elif isinstance(value, float) and dt.kind not in _dt.GRAD_KINDS:
            dt = np.dtype(np.float32)
        elif isinstance(value, int) and not isinstance(value, bool) and dt.kind == "b":
            dt = np.dtype(np.int64)
        arr = np.asarray(value, dtype=dt)
        if type(like._data) is not np.ndarray:  # a number next to a GPU tensor goes to its device
            arr = _device.to_device(arr, like.device)
        return Tensor._from_array(arr)
    if like is not None and isinstance(value, np.generic) and value.dtype.kind in "biufc":
        return as_tensor(as_number(value), like)
    if like is not None and isinstance(value, np.generic) and type(like._data) is not np.ndarray:
        return _shared(value, device=like.device)  # a numpy scalar is a number too: on the GPU tensor's device
    return _shared(value)


def as_number(v: np.generic) -> Any:
    """A numpy scalar (``np.sqrt(2.0)``, ``np.float32(2)``) next to a tensor is a number like Python's: it
    takes the tensor's dtype, as in torch, rather than numpy's promotion (a float32 model would compute
    in float64 after any ``* np.sqrt(...)``). Other numpy scalars (bfloat16's) stay as they are."""
    return v.item() if v.dtype.kind in "biufc" else v


def _shared(data: Any, dtype: Any = None, device: Optional[str] = None) -> Tensor:
    """A Tensor over ``data``'s memory where it can be (``Tensor(data)`` without the copy)."""
    t = _new(Tensor)
    t._base_ref = None
    t._data = _infer_array(data, None if dtype is None else _dt.to_dtype(dtype),
                           None if device is None else _device.parse_device(device))
    return t


def from_numpy(array: np.ndarray) -> Tensor:
    """A Tensor over ``array``'s memory, not a copy (as ``torch.from_numpy``): a write to either is
    seen by the other. Tensors made from one array (or views of it) share one version counter,
    so a write through any of them is seen by the version checks of gradients that saved another."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"from_numpy expects a numpy.ndarray, got {type(array).__name__}")
    if not array.dtype.isnative:
        raise TypeError(f"from_numpy: the array's dtype {array.dtype} is not in this machine's byte order, so "
                        f"its memory cannot be shared; Tensor(array) makes a converted copy")
    t = _shared(array, device=_device.CPU)
    t._vc = owner_counter(t._data, t._vc)
    return t
