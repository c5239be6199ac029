"""``register_custom_backend``: backends written in C++, loaded from a shared library.

The library is built against ``include/opbuilder/backend.h`` (or MindSpore's
names in ``include/mindspore/include/custom_backend_api.h``) and links
nothing of ours. Loading it (ctypes) calls its exported
``opbuilder_backend_init`` with the host table (the callbacks below), which
returns one ``ob_backend`` per backend the library registered. A backend's
``build`` gets the graph as C structs (plugin_graph.py) once per signature;
its ``run`` gets the call's tensors and may run nodes itself, hand nodes
(``run_node``) or a whole graph (``build_builtin``/``run_builtin``) back to
``ms_backend``, and allocate tensors (``alloc``). Tensors cross as pointers
to contiguous numpy arrays that the run context keeps; a handle names each,
so what the plugin returns is checked to be memory the runtime gave out.
"""
from __future__ import annotations

import ctypes as C
import itertools
import os
import sys
import threading
import weakref
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..tensor import Tensor
from . import plugin_abi as abi
from .graph import Const, Graph
from .plugin_graph import CGraph, config_struct, dtype_name
from .registry import Backend, Runner, _add, _backends, _lock

__all__ = ["register_custom_backend", "LIBRARY_SUFFIXES"]

LIBRARY_SUFFIXES = {"darwin": (".dylib", ".so"), "win32": (".dll",)}.get(sys.platform, (".so",))
ERR_LEN = 2048


class _RunCtx:
    """One plugin run: the arrays handed out (by handle), the graph, and a failure to raise afterwards."""

    def __init__(self, cgraph: CGraph) -> None:
        self.cgraph = cgraph
        self.arrays: List[np.ndarray] = []
        self.tensors: List[Optional[Tensor]] = []  # the runtime's tensor over each array, where there is one
        self.keep: List[Any] = []
        self.error: Optional[BaseException] = None

    def put(self, arr: np.ndarray, tensor: Optional[Tensor] = None) -> abi.Tensor:
        c = np.ascontiguousarray(arr)
        shape = (C.c_int64 * max(c.ndim, 1))(*c.shape)
        name = _dtype_bytes(c.dtype)
        self.keep.append(shape)
        self.arrays.append(c)
        self.tensors.append(tensor if c is arr else None)
        return abi.Tensor(c.ctypes.data, name, c.ndim, shape, len(self.arrays) - 1)

    def tensor(self, t: abi.Tensor, what: str) -> Tensor:
        """The tensor a handle names: the call's input or the node output it came from (so an op run by
        ``run_node`` sees the same tensor, with its version and history, as under ms_backend), else a new one."""
        arr = self.get(t, what)
        known = self.tensors[t.handle]
        return known if known is not None and known._data is arr else Tensor._from_array(arr)

    def get(self, t: abi.Tensor, what: str) -> np.ndarray:
        h = t.handle
        if not 0 <= h < len(self.arrays):
            raise RuntimeError(f"{what}: tensor handle {h} was not given out by the runtime in this run (a plugin "
                               f"returns inputs, ctx.Alloc or ctx.RunNode results)")
        arr = self.arrays[h]
        if (t.data or 0) != arr.ctypes.data:
            raise RuntimeError(f"{what}: tensor handle {h} does not match its data pointer")
        return arr


_dtypes: Dict[str, bytes] = {}


def _dtype_bytes(dtype: Any) -> bytes:
    name = np.dtype(dtype).name
    b = _dtypes.get(name)
    if b is None:
        b = _dtypes[name] = dtype_name(dtype)
    return b


_runs: Dict[int, _RunCtx] = {}
_run_ids = itertools.count(1)
_cgraphs: "weakref.WeakValueDictionary[int, CGraph]" = weakref.WeakValueDictionary()
_builtin: Dict[int, Tuple[Runner, int]] = {}  # id -> (ms_backend runner, output count)
_builtin_ids = itertools.count(1)


def _guard(fn: Any) -> Any:
    """A host callback taking a run context: an exception is kept (raised once the plugin returns), rc 1."""
    def call(ctx: Optional[int], *args: Any) -> int:
        run = _runs.get(ctx or 0)
        try:
            if run is None:
                _no_run()
            fn(run, *args)
            return 0
        except BaseException as e:  # noqa: BLE001 (nothing may unwind into C)
            _pending.error = e
            if run is not None:
                run.error = e
            return 1
    return call


def _no_run() -> None:
    raise RuntimeError("a backend plugin called the runtime with no run in progress (a context from an earlier run?)")


class _Pending(threading.local):
    error: Optional[BaseException] = None


_pending = _Pending()


def _build_builtin(graph_p: Any, backend: bytes, config_p: Any, id_out: Any) -> int:
    try:
        name = backend.decode()
        if name != "ms_backend":
            raise ValueError(f"build_builtin: {name!r} is not a built-in backend; the built-in one is 'ms_backend'")
        cg = _cgraphs.get(graph_p.contents.handle)
        if cg is None:
            raise RuntimeError("build_builtin: the graph is not one the runtime gave this plugin (or it was freed)")
        cfg = config_p.contents
        from .ms_backend import build
        run = build(cg.graph, {"jit_level": cfg.jit_level.decode()})
        i = next(_builtin_ids)
        _builtin[i] = (run, len(cg.graph.outputs))
        id_out[0] = i
        return 0
    except BaseException as e:  # noqa: BLE001
        _pending.error = e
        return 1


def _run_builtin(run: _RunCtx, gid: int, nin: int, inputs: Any, cap: int, nout: Any, outputs: Any) -> None:
    entry = _builtin.get(gid)
    if entry is None:
        raise RuntimeError(f"run_builtin: no built-in graph with id {gid} (ids come from build_builtin)")
    runner, n = entry
    nout[0] = n
    if cap < n:
        raise RuntimeError(f"run_builtin: room for {cap} outputs, the graph has {n}")
    xs = [run.tensor(inputs[k], f"run_builtin input {k}") for k in range(nin)]
    for k, o in enumerate(runner(xs)):
        outputs[k] = run.put(o._data, o)


def _run_node(run: _RunCtx, index: int, args: Any, outs: Any) -> None:
    graph = run.cgraph.graph
    if not 0 <= index < len(graph.nodes):
        raise RuntimeError(f"run_node: node {index} is not in graph {graph.name} ({len(graph.nodes)} nodes)")
    node = graph.nodes[index]
    vals = [r.value if isinstance(r, Const) else run.tensor(args[k], f"run_node({node.op}) argument {k}")
            for k, r in enumerate(node.inputs)]
    for k, o in enumerate(graph.run_node(node, vals)):
        outs[k] = run.put(o._data, o)


def _alloc(run: _RunCtx, dtype: bytes, ndim: int, shape: Any, out: Any) -> None:
    dims = tuple(int(shape[d]) for d in range(ndim))
    if any(d < 0 for d in dims):
        raise ValueError(f"alloc: negative dimension in shape {list(dims)}")
    out[0] = run.put(np.empty(dims, dtype=np.dtype(dtype.decode())))


def _get_const(run: _RunCtx, index: int, out: Any) -> None:
    consts = run.cgraph.consts
    if not 0 <= index < len(consts) or not hasattr(consts[index].value, "_data"):
        raise RuntimeError(f"get_const: constant {index} is not a tensor constant of graph {run.cgraph.graph.name}")
    out[0] = run.put(consts[index].value._data)


def _make_host() -> abi.Host:
    verbose = os.environ.get("OPBUILDER_VERBOSE", "") not in ("", "0")
    return abi.Host(abi.ABI, int(verbose), abi.BUILD_BUILTIN(_build_builtin), abi.RUN_BUILTIN(_guard(_run_builtin)),
                    abi.RUN_NODE(_guard(_run_node)), abi.ALLOC(_guard(_alloc)), abi.GET_CONST(_guard(_get_const)))


_host: Optional[abi.Host] = None
_libraries: Dict[str, Tuple[C.CDLL, Dict[str, Any]]] = {}  # resolved path -> (library, its backends by name)


def _failure(what: str, rc: int, err: Any, name: str, path: str) -> RuntimeError:
    pending, _pending.error = _pending.error, None
    msg = err.value.decode(errors="replace") if err.value else (str(pending) if pending else f"returned {rc}")
    exc = RuntimeError(f"backend {name!r} ({path}): {what} failed: {msg}")
    exc.__cause__ = pending
    return exc


def _factory(rec: Any, name: str, path: str, lib: C.CDLL) -> Any:
    def factory(graph: Graph, config: Dict[str, Any]) -> Runner:
        cg = CGraph(graph)
        _cgraphs[cg.handle] = cg
        keep: List[Any] = []
        cfg = config_struct(config, keep)
        gid = C.c_uint64(0)
        err = C.create_string_buffer(ERR_LEN)
        _pending.error = None
        rc = rec.build(rec.self, C.byref(cg.rec), C.byref(cfg), C.byref(gid), err, ERR_LEN)
        if rc != 0:
            raise _failure("Build", rc, err, name, path)
        nout = len(graph.outputs)

        def run(inputs: Sequence[Any]) -> List[Any]:
            ctx = _RunCtx(cg)
            ins = (abi.Tensor * max(len(inputs), 1))()
            for k, t in enumerate(inputs):
                ins[k] = ctx.put(t._data, t)
            outs = (abi.Tensor * max(nout, 1))()
            rid = next(_run_ids)
            rrec = abi.Run(rid, len(inputs), ins, nout, outs)
            _runs[rid] = ctx
            err = C.create_string_buffer(ERR_LEN)
            _pending.error = None
            try:
                rc = rec.run(rec.self, gid.value, C.byref(rrec), err, ERR_LEN)
            finally:
                del _runs[rid]
            if rc != 0:
                _pending.error = ctx.error or _pending.error
                raise _failure("Run", rc, err, name, path)
            if rrec.noutputs != nout:
                raise RuntimeError(f"backend {name!r} ({path}): Run gave {rrec.noutputs} outputs for graph "
                                   f"{graph.name}, which has {nout}")
            res = []
            for k in range(nout):
                arr = ctx.get(outs[k], f"backend {name!r} output {k}")
                want = _meta(graph, k)
                if want is not None and (arr.shape, arr.dtype) != want:
                    raise RuntimeError(f"backend {name!r} ({path}): output {k} is {arr.dtype.name}{list(arr.shape)}; "
                                       f"graph {graph.name} gives {want[1].name}{list(want[0])}")
                res.append(Tensor._from_array(arr))
            return res

        run.cgraph = cg  # type: ignore[attr-defined]  (keeps the plugin's view of the graph alive)
        run.library = lib  # type: ignore[attr-defined]
        return run

    return factory


def _meta(graph: Graph, k: int) -> Optional[Tuple[Tuple[int, ...], np.dtype]]:
    from .graph import Input, Output
    r = graph.outputs[k]
    if isinstance(r, Output):
        n = graph.nodes[r.node]
        return tuple(n.out_shapes[r.index]), np.dtype(n.out_dtypes[r.index])
    if isinstance(r, Input):
        return tuple(graph.input_shapes[r.index]), np.dtype(graph.input_dtypes[r.index])
    return None


def _load(path: str) -> Tuple[C.CDLL, Dict[str, Any]]:
    global _host
    real = os.path.realpath(path)
    if real in _libraries:
        return _libraries[real]
    try:
        lib = C.CDLL(real)
    except OSError as e:
        raise RuntimeError(f"register_custom_backend: cannot load {path}: {e}") from None
    try:
        init = lib.opbuilder_backend_init
    except AttributeError:
        raise RuntimeError(f"register_custom_backend: {path} registers no backend: it exports no "
                           f"opbuilder_backend_init (build it from C++ that includes \"opbuilder/backend.h\" or "
                           f"\"mindspore/include/custom_backend_api.h\" and uses OB_REGISTER_BACKEND / "
                           f"MS_REGISTER_BACKEND)") from None
    init.restype, init.argtypes = abi.INIT
    if _host is None:
        _host = _make_host()
    table = C.POINTER(abi.BackendRec)()
    count = C.c_int32(0)
    rc = init(abi.ABI, C.byref(_host), C.byref(table), C.byref(count))
    if rc != 0:
        raise RuntimeError(f"register_custom_backend: {path} was built for another plugin ABI than this runtime's "
                           f"(version {abi.ABI}); rebuild it against this opbuilder's headers")
    recs = {table[k].name.decode(): table[k] for k in range(count.value)}
    _libraries[real] = (lib, recs)
    return lib, recs


def register_custom_backend(backend_name: str, path: Union[str, os.PathLike]) -> bool:
    """Load the C++ backend ``backend_name`` from the shared library at ``path``; True once it is registered.

    ``path`` must exist and end in a shared-library suffix (ValueError). A
    library that cannot be loaded, or that registers no backend called
    ``backend_name``, is a RuntimeError naming the file and the reason; a
    name already registered is a ValueError.
    """
    if not isinstance(backend_name, str) or not backend_name:
        raise TypeError(f"register_custom_backend: backend_name must be a non-empty str, got {backend_name!r}")
    p = Path(os.fspath(path))
    if not p.name.endswith(LIBRARY_SUFFIXES) and ".so." not in p.name:
        raise ValueError(f"register_custom_backend: {path} is not a shared library (expected a name ending in "
                         f"{' or '.join(LIBRARY_SUFFIXES)}); build one with opbuilder.build_library or "
                         f"`python -m opbuilder build --library`")
    if not p.is_file():
        raise ValueError(f"register_custom_backend: library not found: {path}")
    with _lock:
        if backend_name in _backends:
            raise ValueError(f"register_custom_backend: a backend named {backend_name!r} is already registered "
                             f"(from {_backends[backend_name].origin}); choose another name")
    lib, recs = _load(str(p))
    rec = recs.get(backend_name)
    if rec is None:
        found = ", ".join(recs) if recs else "none"
        raise RuntimeError(f"register_custom_backend: {path} registers no backend named {backend_name!r} "
                           f"(it registers: {found})")
    _add(Backend(backend_name, _factory(rec, backend_name, str(p), lib), bool(rec.differentiable), str(p)))
    return True
