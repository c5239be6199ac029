"""``ops.Custom``: an operator from an aot C function or a Python function, with an optional bprop.

``Custom(func, out_shape, out_dtype, func_type, bprop, reg_info)`` is called
like any op. Per call: inputs to numpy arrays, the outputs' shapes and dtypes
(fixed, or computed from the inputs' by callables), the dtype check against
the op-info, the kernel, and, when an input requires grad, one graph node
whose backward is ``bprop(*inputs, out, dout)``.

aot kernels go through a small compiled call path (aot_call.cpp) that reads
the arrays' pointers, shapes and dtypes, allocates the outputs and calls the
C function; the symbol and the ``extra`` block are resolved once, when the
op is made. A kernel writes its outputs, and the inputs its op-info declares
``inplace``; an input that is read-only reaches it as a private copy, so an
undeclared write can never land in read-only memory (inplace.py).
"""
from __future__ import annotations

import math
import sys
import threading
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..autograd.callback import BpropBackward, record_callback
from ..device import device_of, is_device_array
from ..autograd.grad_mode import _state
from ..dtypes import float32, from_numpy_dtype, to_dtype
from ..tensor import Tensor, _new, type_label
from .aot_extra import ExtraBlock
from .aot_library import AotKernel, BuildOptions, resolve_aot
from .aot_trampoline import trampoline
from .custom_spec import Spec, is_spec_fn as _is_fn
from .inplace import InplaceWrites
from .op_info import OpInfo, parse_reg_info
from .op_entry import op_entry
from ..versions import memory_owner, share_version

__all__ = ["Custom"]

FUNC_TYPES = ("aot", "pyfunc", "hybrid", "akg")
HYBRID_TYPES = ("hybrid", "akg")  # a hybrid DSL function, compiled by runtime.hybrid ("akg": MindSpore's name)
_MEMO_SIZE = 256  # input signatures whose output specs are remembered per op
_MISSING = object()
ShapeArg = Union[None, Sequence[Any], Callable[..., Any]]
DtypeArg = Union[None, Any, Callable[..., Any]]


class _NotLoaded(Exception):
    """What ``except self._failed`` names until an op's call path is loaded; nothing raises it."""


class Custom:
    """An operator whose forward is ``func``; see docs/custom_ops.md.

    ``func``: for ``func_type="aot"`` a string ``"path/lib.so:Symbol"`` or
    ``"path/op.cpp:Symbol"`` (built on first use); for ``"pyfunc"`` a Python
    function on numpy arrays. ``out_shape``/``out_dtype``: a shape and a dtype
    (lists of them for several outputs), or callables of the input shapes /
    dtypes. ``bprop(*inputs, out, dout)`` returns a tuple of input gradients.
    ``reg_info``: op-info from ``CustomRegOp(...).get_op_info()`` (wins over
    ``custom_info_register``). ``include_paths``, ``cflags``, ``ldflags``:
    build options for an aot source (as ``opbuilder.build_library`` takes them).
    """

    def __init__(self, func: Union[str, Callable[..., Any]], out_shape: ShapeArg = None,
                 out_dtype: DtypeArg = None, func_type: Optional[str] = None, bprop: Optional[Callable[..., Any]] = None,
                 reg_info: Any = None, *, include_paths: Optional[Sequence[Any]] = None,
                 cflags: Optional[Union[str, Sequence[str]]] = None,
                 ldflags: Optional[Union[str, Sequence[str]]] = None) -> None:
        from ..hybrid import HybridKernel
        if func_type is None:  # a @kernel function needs no func_type; anything else is aot
            func_type = "hybrid" if isinstance(func, HybridKernel) else "aot"
        if func_type not in FUNC_TYPES:
            raise ValueError(f"func_type {func_type!r} is not supported; accepted: {', '.join(FUNC_TYPES)}")
        if bprop is not None and not callable(bprop):
            raise TypeError(f"bprop must be callable (bprop(*inputs, out, dout) -> tuple), got "
                            f"{type(bprop).__name__}")
        self.func = func
        self.func_type = func_type
        self.out_shape = out_shape
        self.out_dtype = out_dtype
        self.bprop = bprop
        self._kernel: Optional[AotKernel] = None
        self._hybrid: Optional[HybridKernel] = None
        options = BuildOptions(include_paths, cflags, ldflags)
        if func_type == "aot":
            if not isinstance(func, str):
                raise TypeError(f"an aot func is a string 'path/lib.so:Symbol', got {type(func).__name__}")
            if out_shape is None:
                raise ValueError(f"aot op {func!r} needs out_shape (a shape, a list of shapes, or a callable "
                                 f"of the input shapes)")
            self._kernel = resolve_aot(func, options)
            self.name = self._kernel.symbol
            target = self._kernel.backend
        elif func_type in HYBRID_TYPES:
            if options:
                raise ValueError(f"include_paths, cflags and ldflags build an aot source; hybrid kernel "
                                 f"{getattr(func, '__name__', func)!r} is generated and built by runtime.hybrid")
            self._hybrid = func if isinstance(func, HybridKernel) else HybridKernel(func)
            self._hybrid.check()  # the DSL's errors, with file and line, when the op is made
            self.name = self._hybrid.__name__
            target = "CPU"
        else:
            if not callable(func):
                raise TypeError(f"a pyfunc func must be callable, got {type(func).__name__}")
            if options:
                raise ValueError(f"include_paths, cflags and ldflags build an aot source; pyfunc "
                                 f"{getattr(func, '__name__', func)!r} is not built")
            self.name = getattr(func, "__name__", type(func).__name__)
            target = "CPU"
        info = reg_info if reg_info is not None else getattr(func, "reg_info", None)
        self._info: Optional[OpInfo] = parse_reg_info(info, target) if info is not None else None
        self._writes: Optional[InplaceWrites] = InplaceWrites(self.name, self._info.inplace) \
            if self._info is not None and self._info.inplace else None
        self._prim_attrs: dict = {}
        self._fixed: Optional[Tuple[Spec, ...]] = None
        if not _is_fn(out_shape) and not _is_fn(out_dtype) and out_shape is not None and out_dtype is not None \
                and self._hybrid is None:
            self._fixed = self._normalize(out_shape, out_dtype)
        self._memo: Dict[tuple, Optional[Tuple[Spec, ...]]] = {}
        self._extra: Optional[ExtraBlock] = None
        self._initialized = False
        self._init_lock = threading.Lock()  # Init runs once, even when first calls come from several threads
        self._workspaces: Optional[_Workspaces] = None  # Init's, when it asked for some
        self._released: Optional[ExtraBlock] = None  # the block whose kernel data is deleted with the op
        self._host: Optional[Tuple[Any, ...]] = None  # _ready_host's, after the first call
        self._fast: Optional[Tuple[Any, ...]] = None  # _ready_host's: one C call per warm call
        self._cmemo: Optional[Dict[bytes, Tuple[Spec, ...]]] = None  # _memo's specs by run_tensors' keys
        self._memo_key: Optional[Callable[[tuple, bool], bytes]] = None  # the call path's memo_key
        self._run: Optional[Callable[..., Any]] = None  # numpy arrays (_load_path)
        self._call: Optional[Callable[..., Any]] = None  # device memory, aot_device.py (_load_path)
        self._failed: type = _NotLoaded  # KernelFailed: (status, error text) of the call that failed
        if self._kernel is not None or self._hybrid is not None:
            self._extra = self._make_extra()

    def _load_path(self) -> None:
        """The compiled call path (aot_trampoline.py), loaded at an aot or hybrid op's first call, not when
        the op is made: making an op (at a module's import, say) compiles nothing. Until then ``_failed``
        is ``_NotLoaded``, so an ``except self._failed`` clause loads and builds nothing either."""
        if self._run is None:
            path = trampoline()
            self._failed, self._call, self._run = path.KernelFailed, path.call_at, path.run

    def __repr__(self) -> str:
        return f"Custom(func={self.func!r}, func_type={self.func_type!r})"

    def add_prim_attr(self, name: str, value: Any) -> "Custom":
        """Set an attribute the kernel reads with ``AotExtra::Attr`` (before the first call)."""
        if self._initialized:
            raise RuntimeError(f"Custom '{self.name}': attributes must be set before the first call "
                               f"(the kernel, and its Init if it has one, already ran with the old ones)")
        self._prim_attrs[name] = value
        if self._kernel is not None:
            self._extra = self._make_extra()
        return self

    # ---- the call --------------------------------------------------------
    @op_entry("custom", lambda op: f"Custom({op.name})")  # op(*inputs); traced: one node, the op its target
    def __call__(self, inputs: Tuple[Any, ...]) -> Any:
        fast = self._fast
        if fast is not None:  # one C call: Tensors' arrays in, the kernel, the outputs as Tensors (or None)
            try:
                out = fast[0](fast[1], fast[2], inputs, fast[3], Tensor, _state.enabled, fast[5])
            except self._failed as e:
                raise self._error(fast[4], *e.args) from None
            except TypeError:
                self._refuse_device(tuple([getattr(x, "_data", x) for x in inputs]))
                raise
            if out is not None:
                return out
        arrays = tuple([x._data for x in inputs if isinstance(x, Tensor)])
        if len(arrays) != len(inputs):  # numpy arrays or numbers among them: checked one by one
            arrays = tuple([x._data if isinstance(x, Tensor) else _array(self.name, i, x)
                            for i, x in enumerate(inputs)])
        specs = self._fixed
        if specs is None or self._info is not None:
            # output specs (and the op-info check) depend only on the inputs' shapes and dtypes
            sig = tuple([(a.shape, a.dtype) for a in arrays]) if specs is None else tuple([a.dtype for a in arrays])
            specs = self._memo.get(sig, _MISSING)
            if specs is _MISSING:
                specs = self._prepare(arrays, sig)
        host = self._host
        if host is not None:  # a host aot kernel whose Init ran, with nothing to do around its call
            try:
                outs = host[0](host[1], host[2], arrays, specs, ())
            except self._failed as e:
                raise self._error(host[3], *e.args) from None
            except TypeError:
                self._refuse_device(arrays)
                raise
        else:
            outs = self._call_general(inputs, arrays, specs)
        if len(outs) == 1:
            res = _new(Tensor)
            res._base_ref = None
            res._data = outs[0]
            if _state.enabled:
                for x in inputs:
                    if isinstance(x, Tensor) and x.requires_grad:
                        return self._record(inputs, outs, [res])[0]
            return res
        many = [Tensor._from_array(o) for o in outs]
        if self._kernel is None and self._hybrid is None:  # a pyfunc may return one array twice, or a view of one
            _share_counters(outs, many)
        if _state.enabled:
            for x in inputs:
                if isinstance(x, Tensor) and x.requires_grad:
                    many = self._record(inputs, outs, many)
                    break
        return many[0] if len(many) == 1 else tuple(many)

    def _call_general(self, inputs: Tuple[Any, ...], arrays: Tuple[np.ndarray, ...],
                      specs: Any) -> Sequence[np.ndarray]:
        """The kernel call of every op but a ready host aot kernel: inplace writes, devices, Init, pyfuncs."""
        writes = self._writes
        if writes is not None:
            arrays, back = writes.before(inputs, arrays)
        if self._kernel is not None:
            outs = self._call_aot(arrays, specs)
            if self._host is None:
                self._ready_host()
        elif self._hybrid is not None:
            from .custom_hybrid import call_hybrid
            outs = call_hybrid(self, arrays, specs)
        else:
            outs = self._call_py(arrays, specs)
        if writes is not None:
            writes.after(inputs, back)
        return outs

    def _ready_host(self) -> None:
        """Once a host aot kernel's Init has run and its calls need no workspaces or inplace writes, the
        direct paths of __call__: ``_host`` (run, fn, extra address, symbol), the call _call_aot makes; and
        ``_fast`` (run_tensors, fn, extra, specs, symbol, with_shapes), one C call from Tensors in to
        Tensors out. Its specs are the fixed ones, or, for specs that depend on the inputs (out_shape or
        out_dtype callables, an op-info's dtype check), ``_cmemo``: what ``_memo`` remembers, keyed in C
        by the inputs' dtypes (and shapes), so a warm call runs no Python; a new signature goes once
        through ``_prepare``, which adds it."""
        k = self._kernel
        if k is None or k.cuda is not None or not self._initialized or self._workspaces is not None \
                or self._writes is not None or self._extra is None:
            return
        self._host = (self._run, k.fn, self._extra.address, k.symbol)
        path = trampoline()
        if self._fixed is not None and self._info is None:
            self._fast = (path.run_tensors, k.fn, self._extra.address, self._fixed, k.symbol, False)
            return
        with_shapes = self._fixed is None  # _memo's signatures: shapes and dtypes, or dtypes only
        self._memo_key = path.memo_key
        self._cmemo = {path.memo_key(sig, with_shapes): specs for sig, specs in self._memo.items()
                       if specs is not None}
        self._fast = (path.run_tensors, k.fn, self._extra.address, self._cmemo, k.symbol, with_shapes)

    def _record(self, inputs: Sequence[Any], outs: Sequence[np.ndarray], res: List[Tensor]) -> List[Tensor]:
        name = f"Custom({self.name})"
        if self.bprop is None:
            backward = self._no_bprop
        else:
            backward = BpropBackward(f"{name} bprop", inputs, outs, len(outs) == 1, self.bprop)
        return record_callback(name, inputs, res, backward)

    def _no_bprop(self, grads: List[Any], create_graph: bool) -> Sequence[Any]:
        raise RuntimeError(f"Custom '{self.name}' has no bprop, so no gradient flows through it; pass "
                           f"bprop=fn(*inputs, out, dout) to ops.Custom, or call it in an nn.Cell that "
                           f"defines bprop")

    # ---- outputs: shapes and dtypes --------------------------------------
    def _specs(self, arrays: Sequence[np.ndarray]) -> Optional[Tuple[Spec, ...]]:
        shapes = self.out_shape
        if _is_fn(shapes):
            shapes = self._declared(shapes, "shape", [list(a.shape) for a in arrays],
                                    "the output's shape (a list of ints, [] for a scalar) or a list of shapes")
        dtypes = self.out_dtype
        if _is_fn(dtypes):
            dtypes = self._declared(dtypes, "dtype", [from_numpy_dtype(a.dtype) for a in arrays],
                                    "the output's dtype (e.g. rt.float32) or a list of dtypes")
        if shapes is None:  # a pyfunc that declares nothing: taken from its results
            return None
        if dtypes is None:
            dtypes = from_numpy_dtype(arrays[0].dtype) if arrays else float32
        return self._normalize(shapes, dtypes)

    def _declared(self, fn: Callable[..., Any], what: str, args: List[Any], want: str) -> Any:
        """``fn(*args)``, the out_shape/out_dtype function's answer; None is an error naming the op, and so is
        a call with a number of inputs the function does not take."""
        try:
            out = fn(*args)
        except TypeError:
            import inspect
            try:  # its own signature (a decorator's *args takes anything: then its own error stands)
                sig = inspect.signature(fn, follow_wrapped=False)
                sig.bind(*args)
            except TypeError:
                raise TypeError(f"Custom '{self.name}' was called with {len(args)} input(s), which its out_{what} "
                                f"function {getattr(fn, '__name__', fn)}{sig} does not take: "
                                f"pass one tensor per input of the op") from None
            except ValueError:  # no signature to read (a builtin): its own error
                pass
            raise
        if out is None:
            raise ValueError(f"Custom '{self.name}': its out_{what} function returned None for input {what}s "
                             f"{args}; it must return {want}, one per output")
        return out

    def _normalize(self, shapes: Any, dtypes: Any) -> Tuple[Spec, ...]:
        """((shape, numpy dtype), ...) from one shape and dtype, or lists of them."""
        multi = isinstance(shapes, (list, tuple)) and len(shapes) > 0 and all(
            isinstance(s, (list, tuple)) for s in shapes)
        shape_list = list(shapes) if multi else [shapes]
        dtype_list = list(dtypes) if isinstance(dtypes, (list, tuple)) else [dtypes]
        if len(shape_list) != len(dtype_list):
            raise ValueError(f"Custom '{self.name}': out_shape gives {len(shape_list)} output(s) but out_dtype "
                             f"{len(dtype_list)}")
        specs = []
        for k, (s, d) in enumerate(zip(shape_list, dtype_list)):
            if not isinstance(s, (list, tuple)) or not all(
                    isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= 0 for n in s):
                raise ValueError(f"Custom '{self.name}': output {k} shape {s!r} is not a list of "
                                 f"non-negative ints")
            try:
                dt = to_dtype(d).np
            except TypeError as e:
                raise TypeError(f"Custom '{self.name}': output {k} dtype: {e}") from None
            shape = tuple(int(n) for n in s)
            # (zeros left out: numpy refuses dims whose other product overflows, even with a zero among them)
            if math.prod(n for n in shape if n) * dt.itemsize > sys.maxsize:
                raise MemoryError(f"Custom '{self.name}': cannot allocate output {k} of shape {list(shape)} and "
                                  f"dtype {from_numpy_dtype(dt)}: its size in bytes overflows")
            specs.append((shape, dt))
        return tuple(specs)

    def _prepare(self, arrays: Sequence[np.ndarray], sig: tuple) -> Optional[Tuple[Spec, ...]]:
        """Output specs for inputs like ``arrays``, checked against the op-info; remembered by ``sig``."""
        info = self._info
        if info is not None and info.n_inputs and len(arrays) != info.n_inputs:  # before the shape rules run
            raise TypeError(f"Custom '{self.name}' takes {info.n_inputs} inputs (its reg_info), got {len(arrays)}")
        if self._hybrid is not None:
            from .custom_hybrid import hybrid_specs
            specs = hybrid_specs(self, arrays)
        else:
            specs = self._fixed if self._fixed is not None else self._specs(arrays)
        if info is not None:
            if specs is not None:
                if info.n_outputs and len(specs) != info.n_outputs:
                    raise ValueError(f"Custom '{self.name}': reg_info declares {info.n_outputs} outputs, "
                                     f"out_shape gives {len(specs)}")
                info.check_dtypes(f"Custom '{self.name}'", [a.dtype for a in arrays], [d for _, d in specs])
            else:  # a pyfunc whose outputs are known only after the call: check the inputs now
                info.check_dtypes(f"Custom '{self.name}'", [a.dtype for a in arrays], None)
        if len(self._memo) >= _MEMO_SIZE:
            self._memo.clear()
            if self._cmemo is not None:
                self._cmemo.clear()
        self._memo[sig] = specs
        if self._cmemo is not None and specs is not None:
            self._cmemo[self._memo_key(sig, self._fixed is None)] = specs
        return specs

    # ---- aot ---------------------------------------------------------------
    def _make_extra(self) -> ExtraBlock:
        attrs = self._info.attr_values(f"Custom '{self.name}'", self._prim_attrs) if self._info else \
            dict(self._prim_attrs)
        return ExtraBlock(attrs)

    def _call_aot(self, arrays: Tuple[np.ndarray, ...], specs: Tuple[Spec, ...]) -> Tuple[np.ndarray, ...]:
        k = self._kernel
        assert k is not None and self._extra is not None
        self._load_path()
        if k.cuda is not None:
            return self._call_aot_device(arrays, specs)
        if not self._initialized:
            self._init_once(self._init_host, arrays, specs)
        ws = self._workspaces
        scratch = ws.take() if ws is not None else ()
        try:
            return self._run(k.fn, self._extra.address, arrays, specs, scratch)
        except self._failed as e:
            raise self._error(k.symbol, *e.args) from None
        except TypeError:
            self._refuse_device(arrays)
            raise
        finally:
            if ws is not None:
                ws.give(scratch)

    def _refuse_device(self, arrays: Tuple[Any, ...]) -> None:
        """After the call path refused an argument (TypeError): device arrays given to host code say so."""
        k = self._kernel
        assert k is not None
        if any(type(a) is not np.ndarray and is_device_array(a) for a in arrays):
            raise RuntimeError(f"aot operator '{k.symbol}' in {k.library} is host code (it neither carries "
                               f"device code nor links the CUDA runtime), but its inputs are on "
                               f"{device_of(next(a for a in arrays if is_device_array(a)))}; move them to the "
                               f"CPU (Tensor.to('CPU')) or call a CUDA build") from None

    def _call_aot_device(self, arrays: Tuple[Any, ...], specs: Tuple[Spec, ...]) -> Tuple[Any, ...]:
        """A CUDA library: device pointers and the current stream; host tensors are refused, never passed.
        Called by ``_call_aot``, which has loaded the call path.

        Only the arrays differ from the host path: Init runs once through ``_init_once`` and the kernel
        call goes through the same compiled call (its own ``extra``, a failure raised as ``_error``)."""
        k = self._kernel
        assert k is not None and self._extra is not None
        host = [i for i, a in enumerate(arrays) if isinstance(a, np.ndarray)]
        if host or not arrays:
            from ..cuda import unavailable_reason
            why = unavailable_reason()
            raise RuntimeError(
                f"aot operator '{k.symbol}' in {k.library} is CUDA code ({k.cuda}) and needs tensors on a GPU "
                f"device, but input(s) {host} are on the CPU (host memory): its kernel would be handed host "
                f"pointers. Put the inputs on the GPU (Tensor(..., device='GPU'), .to('GPU'), or "
                f"set_context(device_target='GPU'))" + (f"; no GPU is usable here: {why}" if why else ""))
        from .aot_device import call_on_device, init_on_device
        if not self._initialized:
            self._init_once(init_on_device, arrays, specs)
        sizes = self._extra.workspace_sizes() if k.init is not None else ()
        try:
            return tuple(call_on_device(self._call, k.fn, self._extra.address, arrays, specs, sizes,
                                        f"aot operator '{k.symbol}'"))
        except self._failed as e:
            raise self._error(k.symbol, *e.args) from None

    def _init_once(self, run_init: Callable[[int, int, Tuple[Any, ...], Tuple[Spec, ...]], int],
                   arrays: Tuple[Any, ...], specs: Tuple[Spec, ...]) -> None:
        """Run ``<Symbol>Init`` (if the library has one) as ``run_init(init, extra, arrays, specs) -> status``,
        once per op: first calls from several threads wait for the one Init (each running its own would
        replace the kernel data the others use). A failed Init raises, and the next call tries again."""
        k = self._kernel
        extra = self._extra
        assert k is not None and extra is not None
        with self._init_lock:
            if self._initialized:
                return
            if k.init is not None:
                status = run_init(k.init, extra.address, arrays, specs)
                if self._released is not extra:  # once per block, however often a failing Init is retried
                    weakref.finalize(self, _release, trampoline().release, extra)
                    self._released = extra
                err = extra.take_error()
                if status != 0 or err:
                    raise self._error(k.symbol + "Init", status, err)
            self._initialized = True

    def _init_host(self, init: int, extra: int, arrays: Tuple[np.ndarray, ...], specs: Tuple[Spec, ...]) -> int:
        """Init on the CPU: its status; the workspaces it asked for are allocated as calls need them."""
        status = trampoline().init(init, extra, arrays, specs)
        assert self._extra is not None
        sizes = self._extra.workspace_sizes()
        self._workspaces = _Workspaces(sizes) if sizes else None
        return status

    def _error(self, symbol: str, status: int, err: str) -> RuntimeError:
        """The RuntimeError for a failed call of ``symbol`` (the kernel, or its Init): its status, its error text."""
        k = self._kernel
        assert k is not None
        where = f"aot operator '{symbol}' in {k.library}"
        if status != 0:
            return RuntimeError(f"{where} returned status {status}" + (f": {err}" if err else ""))
        return RuntimeError(f"{where}: {err}")

    # ---- pyfunc ------------------------------------------------------------
    def _declared_dtype(self, o: np.ndarray, dt: Any, k: int) -> np.ndarray:
        """A pyfunc's output ``k`` in the dtype declared for it. A cast that would change its values
        silently (a float into an integer, an integer out of the declared type's range, complex into
        real) is a TypeError, as a wrong shape is a ValueError."""
        dt = np.dtype(dt)
        ok = _lossless_kind(o.dtype, dt)
        if ok and dt.kind in "iu" and o.dtype.kind in "iu" and o.size:
            info = np.iinfo(dt)
            ok = bool(o.min() >= info.min and o.max() <= info.max)
        if not ok:
            raise TypeError(f"pyfunc '{self.name}' output {k} is {from_numpy_dtype(o.dtype)}, out_dtype declares "
                            f"{from_numpy_dtype(dt)}: the cast would change its values (truncate, wrap or drop "
                            f"the imaginary part); return that dtype (result.astype(...)) or declare the result's")
        return o.astype(dt)

    def _result_dtypes(self, arrays: Sequence[np.ndarray], n: int) -> Optional[List[np.dtype]]:
        """The numpy dtypes out_dtype declares for a pyfunc without out_shape (None: none declared)."""
        dtypes = self.out_dtype
        if dtypes is None:
            return None
        if _is_fn(dtypes):
            dtypes = self._declared(dtypes, "dtype", [from_numpy_dtype(a.dtype) for a in arrays],
                                    "the output's dtype (e.g. rt.float32) or a list of dtypes")
        listed = list(dtypes) if isinstance(dtypes, (list, tuple)) else [dtypes]
        if len(listed) != n:
            raise ValueError(f"pyfunc '{self.name}' returned {n} outputs, out_dtype declares {len(listed)}")
        try:
            return [to_dtype(d).np for d in listed]
        except TypeError as e:
            raise TypeError(f"Custom '{self.name}': out_dtype: {e}") from None

    def _call_py(self, arrays: Tuple[np.ndarray, ...], specs: Optional[Tuple[Spec, ...]]) -> List[np.ndarray]:
        # an input not declared inplace is read-only to the function: a write raises numpy's error, where
        # it would change the caller's tensor (or the base of a broadcast) with no version counted
        written = self._writes.indices if self._writes is not None else ()
        res = self.func(*[a if i in written or type(a) is not np.ndarray else _read_only(a)  # type: ignore[operator]
                          for i, a in enumerate(arrays)])
        if res is None:  # a missing return: said before any count is compared
            raise TypeError(f"pyfunc '{self.name}' returned None; {_RETURNS}")
        items = list(res) if isinstance(res, (tuple, list)) else [res]
        if specs is not None and len(items) != len(specs):
            raise ValueError(f"pyfunc '{self.name}' returned {len(items)} outputs, out_shape declares {len(specs)}")
        dtypes_only = self._result_dtypes(arrays, len(items)) if specs is None else None
        outs = []
        for k, r in enumerate(items):
            o = r._data if isinstance(r, Tensor) else np.asarray(r)
            if o.dtype == object:  # None, a string, a dict ...: not a tensor's values
                raise TypeError(f"pyfunc '{self.name}' {_which_output(k, res)} {_what(r)}; {_RETURNS}")
            try:
                from_numpy_dtype(o.dtype)
            except TypeError as e:
                raise TypeError(f"pyfunc '{self.name}' output {k}: {e}") from None
            if specs is not None:
                shape, dt = specs[k]
                if o.shape != shape:
                    raise ValueError(f"pyfunc '{self.name}' output {k} has shape {list(o.shape)}, out_shape "
                                     f"declares {list(shape)}")
                if o.dtype != dt:
                    o = self._declared_dtype(o, dt, k)
            elif dtypes_only is not None and o.dtype != dtypes_only[k]:
                o = self._declared_dtype(o, dtypes_only[k], k)
            if any(np.may_share_memory(o, a) for a in arrays):
                o = o.copy()  # an output never aliases an input
            outs.append(o)
        return outs


def _lossless_kind(src: np.dtype, dst: np.dtype) -> bool:
    """Whether casting ``src`` to ``dst`` keeps the kind of value: within floats (bfloat16 too), from
    integers or bools to floats, within integers (ranges are checked apart), not floats into integers."""
    if "V" in (src.kind, dst.kind):  # bfloat16 (numpy has no cast rules for it)
        return src.kind in "biufV" and dst.kind in "fV"
    if src.kind in "iu" and dst.kind in "iu":  # signed and unsigned: the values' range decides
        return True
    return bool(np.can_cast(src, dst, casting="same_kind"))


class _Workspaces:
    """The host workspaces an Init asked for: a set per running call (calls from several threads never share
    one), each kept for later calls, so one thread's calls all use the first set."""

    def __init__(self, sizes: Sequence[int]) -> None:
        self.sizes = tuple(sizes)
        self.free: List[Tuple[np.ndarray, ...]] = []  # list.pop and append are atomic under the GIL

    def take(self) -> Tuple[np.ndarray, ...]:
        try:
            return self.free.pop()
        except IndexError:
            return tuple(np.empty(n, np.uint8) for n in self.sizes)

    def give(self, scratch: Tuple[np.ndarray, ...]) -> None:
        self.free.append(scratch)


def _release(release: Callable[[int], None], block: ExtraBlock) -> None:
    """Delete what an Init kept with SetKernelData (``block`` stays alive until then)."""
    release(block.address)


def _read_only(a: np.ndarray) -> np.ndarray:
    """A read-only view of ``a``'s elements."""
    v = a.view()
    v.flags.writeable = False
    return v


def _share_counters(outs: Sequence[np.ndarray], tensors: Sequence[Tensor]) -> None:
    """Outputs over one memory (``return y, y``, or views of one array: ``y, y[:2]``, ``y[:2], y[2:]``)
    count writes on one counter, as views of one torch tensor do and a C++ Function's ``{y, y}`` does: a
    write through one is seen by a node that saved another."""
    first: Dict[int, Tensor] = {}  # id of the array that owns the memory -> the first output over it
    for o, t in zip(outs, tensors):
        owner = memory_owner(o)
        seen = first.setdefault(id(owner), t)
        if seen is not t:
            share_version(t, seen)


_RETURNS = "a pyfunc must return its outputs as Tensors, numpy arrays or numbers (a tuple or list of them for several)"


def _which_output(k: int, res: Any) -> str:
    """'returned' for a single result, 'output k is' for one of a tuple or list."""
    return f"output {k} is" if isinstance(res, (tuple, list)) else "returned"


def _what(r: Any) -> str:
    """How a pyfunc result that holds no tensor values is described: ``None``, or its type."""
    return "None" if r is None else f"a {type(r).__name__} ({r!r:.60})"


def _array(op: str, i: int, x: Any) -> np.ndarray:
    """An input that is not a Tensor: a numpy array or a Python number."""
    if isinstance(x, np.ndarray):
        from_numpy_dtype(x.dtype)
        return x
    if isinstance(x, (bool, int, float, np.generic)):
        return Tensor(x)._data
    kind = type_label(x)
    hint = " (runtime.from_dlpack(x) makes a Tensor of another library's array)" if hasattr(x, "__dlpack__") else ""
    raise TypeError(f"Custom '{op}': input {i} is a {kind}; pass Tensors, numpy arrays or numbers{hint}")
