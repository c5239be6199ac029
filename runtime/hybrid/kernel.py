"""``HybridKernel``: a DSL function, checked, with its specializations, and the ``kernel`` decorator.

A ``HybridKernel`` is called like the function on numpy arrays (the Python
target) and is what ``ops.Custom`` builds and calls. Per (dtypes, ranks) of
its inputs it generates C++ once (cxx.py) and builds it (library.py); the
resolved kernel is kept in the process, the library in the builder's cache.

Targets: ``"cpu"`` (compiled; the default) or ``"python"``; the environment
variable ``OPBUILDER_HYBRID_TARGET`` overrides the default. Debug builds
(``debug=True`` or ``OPBUILDER_HYBRID_DEBUG=1``) check every index against
its extent (an out-of-range index is a RuntimeError naming the DSL line) and
fill float outputs with NaN first, so reading an element never written shows.

Where numpy or Python would raise (a negative integer power, int() of NaN, an
element assignment out of an integer dtype's range, ``int8 + 300``), the
compiled kernel stops and returns the status of that check; ``raised`` turns
it into the same exception (ValueError, OverflowError) naming the DSL line.
"""
from __future__ import annotations

import hashlib
import os
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..ops.aot_library import AotKernel
from .callee import DslKernel
from .cxx import RAISE_BASE, generate, generate_kernel, tensor_types
from .dsl import DTYPES
from .pytarget import run_python
from .shapes import declared_specs
from .inline import Expanded, expand
from .names import symbol_stem
from .source import ParsedKernel
from .validate import KernelInfo

__all__ = ["HybridKernel", "kernel", "ms_kernel", "build_together", "TARGETS", "TARGET_ENV", "DEBUG_ENV"]

TARGETS = ("cpu", "python")
TARGET_ENV = "OPBUILDER_HYBRID_TARGET"
DEBUG_ENV = "OPBUILDER_HYBRID_DEBUG"
Signature = Tuple[Tuple[str, int], ...]  # (dtype name, rank) per input
_MISSING = object()


def _same_value(a: Any, b: Any) -> bool:
    """Whether two values of an outside name give the same generated code (floats by their bits: -0.0, NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (float, np.floating)):
        return float(a).hex() == float(b).hex()
    try:
        return bool(a == b)
    except Exception:  # an object whose == is not a bool (an array): compare identity only
        return False


class _Watch:
    """The outside names a checked kernel read, each looked up where the function looks it up (a closure
    cell, else its module's globals), with the value it had: ``current()`` says whether all still have it.

    A warm call pays one dict lookup and an identity test per name; a rebinding to an equal value (a notebook
    cell run again) is noted on the first call that sees it and costs nothing afterwards."""

    def __init__(self, bindings: Sequence[Tuple[Callable[..., Any], str, Any]]) -> None:
        self.items: List[List[Any]] = []
        for func, name, value in bindings:
            code = getattr(func, "__code__", None)
            cell = None
            if code is not None and name in code.co_freevars:
                cell = func.__closure__[code.co_freevars.index(name)]  # type: ignore[index]
            self.items.append([cell if cell is not None else getattr(func, "__globals__", {}), cell is not None,
                               name, value])

    def current(self) -> bool:
        for item in self.items:
            where, is_cell, name, value = item
            if is_cell:
                try:
                    cur = where.cell_contents
                except ValueError:
                    cur = _MISSING
            else:
                cur = where.get(name, _MISSING)
            if cur is not value:
                if not _same_value(cur, value):
                    return False
                item[3] = cur  # equal: the identity test passes from now on
        return True


# Each builtin numeric dtype's name, looked up by the dtype. ``dtype.name`` is computed in Python on every
# access (numpy's _dtype._name_get, about 1.7 us: a third of a warm call of a one-input kernel, where this
# lookup costs 0.02 us; numpy caches a dtype's hash). It is right for any dtype equal to a key, not only the
# key itself (a dtype made anew, with metadata): a numeric dtype's name is its kind and item size, which
# equal dtypes share. Any other dtype (another byte order, a string) is not found and asked its name.
_DTYPE_NAMES = {np.dtype(c): np.dtype(c).name for c in "?bhilqBHILQefdg"}


def signature_of(arrays: Sequence[np.ndarray]) -> Signature:
    """The (dtype name, rank) of each array: the signature ``HybridKernel.compiled`` takes."""
    return tuple([(_DTYPE_NAMES.get(a.dtype) or a.dtype.name, a.ndim) for a in arrays])


_ENV_KEYS = {name: os.fsencode(name) for name in (TARGET_ENV, DEBUG_ENV)}


def _env(name: str) -> str:
    """``os.environ.get(name, "")``, read on every call (a setting changed at run time applies to the next
    call) from os.environ's private ``_data`` (where it has one): ``os.environ.get`` encodes the key, and for
    an unset name raises and catches a KeyError inside, about 0.6 us against 0.1 us; both names are read by
    each warm call, which took 8.3 us against 6.9 us with ``_data`` (benchmarks/hybrid.py --calls)."""
    data = getattr(os.environ, "_data", None)
    if os.name == "posix" and isinstance(data, dict):
        v = data.get(_ENV_KEYS[name])
        return "" if v is None else os.fsdecode(v)
    return os.environ.get(name, "")


def _env_flag(name: str) -> bool:
    return _env(name).lower() not in ("", "0", "false", "no", "off")


def _check_target(target: str) -> str:
    t = target.lower()
    if t not in TARGETS:
        raise ValueError(f"hybrid target {target!r} is not one of {', '.join(TARGETS)} (GPU code generation "
                         f"is not available yet)")
    return t


class HybridKernel(DslKernel):
    """A function in the hybrid DSL; see docs/hybrid.md."""

    def __init__(self, func: Callable[..., Any], target: Optional[str] = None, debug: Optional[bool] = None) -> None:
        if isinstance(func, HybridKernel):
            func = func.func
        if not callable(func) or not hasattr(func, "__code__"):
            raise TypeError(f"a hybrid kernel is a Python function, got {type(func).__name__}")
        self.func = func
        self.__name__ = getattr(func, "__name__", "kernel")
        self.__doc__ = getattr(func, "__doc__", None)
        self._target = _check_target(target) if target is not None else None
        self._debug = debug
        self._expanded: Optional[Expanded] = None
        self._watch: Optional[_Watch] = None
        self._built: Dict[Tuple[Signature, bool], AotKernel] = {}
        self._raises: Dict[str, Tuple[Tuple[type, str], ...]] = {}  # per built symbol: its check sites
        self._lock = threading.RLock()  # check() re-expands inside compiled()'s lock

    def __repr__(self) -> str:
        return f"HybridKernel({self.__name__}, target={self.target!r})"

    @property
    def target(self) -> str:
        """Where the kernel runs: the target given, else $OPBUILDER_HYBRID_TARGET, else "cpu"."""
        return self._target or _check_target(_env(TARGET_ENV) or "cpu")

    @property
    def debug(self) -> bool:
        return self._debug if self._debug is not None else _env_flag(DEBUG_ENV)

    # ---- checking --------------------------------------------------------
    def check(self) -> KernelInfo:
        """Parse, inline the DSL functions it calls, and validate; HybridSyntaxError naming file:line.

        Done once, and again whenever a name it reads from outside (a module constant, a DSL function it
        calls) has been rebound since: the code generated from the old value is dropped, so a changed
        constant is used (or refused, if it is no longer a number) by the next call, never silently ignored.
        """
        e = self._expanded
        if e is None or (self._watch is not None and not self._watch.current()):
            with self._lock:
                e = self._expanded
                if e is None or (self._watch is not None and not self._watch.current()):
                    self._expanded = None
                    self._built = {}
                    e = expand(self.func)
                    self._watch = _Watch(e.bindings) if e.bindings else None
                    self._expanded = e
        return e.info

    @property
    def parsed(self) -> ParsedKernel:
        """The function's tree, with the DSL functions it calls inlined."""
        self.check()
        assert self._expanded is not None
        return self._expanded.parsed

    @property
    def n_outputs(self) -> int:
        return len(self.check().outputs)

    def output_specs(self, shapes: Sequence[Sequence[int]], dtypes: Sequence[Any]) -> List[Tuple[Tuple[int, ...], str]]:
        """(shape, dtype name) of each output for inputs of these shapes and dtypes, from the declarations."""
        info = self.check()
        return declared_specs(self.parsed, info, shapes, [np.dtype(d).name for d in dtypes])

    def output_types(self, sig: Signature) -> List[Tuple[str, int]]:
        """(dtype name, rank) of each output for inputs of these (dtype, rank): fixed by the code."""
        info = self.check()
        self._check_dtypes(sig)
        types = tensor_types(self.parsed, info, sig)
        return [types[n] for n in info.outputs]

    def _check_dtypes(self, sig: Signature) -> None:
        """A TypeError naming the first input whose dtype the DSL has no type for (bfloat16, complex)."""
        for i, (dt, _) in enumerate(sig):
            if dt not in DTYPES:
                raise TypeError(f"hybrid kernel '{self.func.__name__}': input {i} is {dt}, which is not a dtype "
                                f"of the hybrid DSL (it takes {', '.join(DTYPES)}); cast it first")

    # ---- the two targets ------------------------------------------------
    def __call__(self, *inputs: Any) -> Any:
        """Run on numpy arrays (or Tensors) with the Python target, as MindSpore's kernel functions run."""
        self.check()
        arrays = [_as_array(x) for x in inputs]
        assert self._expanded is not None
        outs = run_python(self.func, arrays, self.debug, self._expanded.calls)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def symbol(self, sig: Signature) -> str:
        """The C symbol of one specialization: the kernel's name plus a hash of what decides its code."""
        info = self.check()
        assert self._expanded is not None
        key = repr((self.parsed.normalized, self._expanded.sources, sorted(info.constants.items()), sig,
                    self.debug, "cpu"))
        return f"hybrid_{symbol_stem(self.__name__)}_{hashlib.sha256(key.encode()).hexdigest()[:12]}"

    def source(self, *inputs: Any) -> str:
        """The generated C++ for inputs like these (arrays, Tensors, or (dtype, rank) pairs)."""
        sig = _signature(inputs)
        return generate(self.parsed, self.check(), self.symbol(sig), sig, self.debug)

    def compiled(self, sig: Signature) -> AotKernel:
        """The built kernel for inputs of these (dtype, rank); generated and built on first use (and again
        after a module constant it reads changed, or the debug setting did)."""
        self.check()
        key = (sig, self.debug)
        k = self._built.get(key)
        if k is None:
            self._check_dtypes(sig)
            with self._lock:
                k = self._built.get(key)
                if k is None:
                    from .library import build_kernel
                    symbol = self.symbol(sig)
                    gen = generate_kernel(self.parsed, self.check(), symbol, sig, self.debug)
                    k = build_kernel(symbol, gen.text)
                    self._raises[symbol] = gen.raises
                    self._built[key] = k
        return k

    def raised(self, symbol: str, status: int) -> Optional[Exception]:
        """The exception a compiled kernel's non-zero ``status`` stands for: where numpy or Python would raise
        (ValueError, OverflowError), the kernel stopped at that check and returned its status. None for
        another status (a debug index check, a failed output size check)."""
        sites = self._raises.get(symbol, ())
        k = status - RAISE_BASE
        if not 0 <= k < len(sites):
            return None
        exc, message = sites[k]
        return exc(message)


def build_together(specs: Sequence[Tuple[HybridKernel, Signature]], cflags: Sequence[str] = (),
                   ldflags: Sequence[str] = ()) -> List[AotKernel]:
    """Build these specializations (kernel, input (dtype, rank) signature) as one library: one compiler run
    for many kernels (a test suite's, a model's). Each kernel then uses its own without building.

    ``cflags``/``ldflags`` are added to the usual flags (e.g. ``-fsanitize=address,undefined``).
    """
    from .library import build_kernels
    items, raises = [], []
    for k, sig in specs:
        symbol = k.symbol(sig)
        gen = generate_kernel(k.parsed, k.check(), symbol, sig, k.debug)
        items.append((symbol, gen.text))
        raises.append(gen.raises)
    built = build_kernels(items, cflags, ldflags)
    for (k, sig), aot, sites in zip(specs, built, raises):
        with k._lock:
            k._raises[aot.symbol] = sites
            k._built[(sig, k.debug)] = aot
    return built


def _as_array(x: Any) -> np.ndarray:
    data = getattr(x, "_data", None)
    return data if isinstance(data, np.ndarray) else np.asarray(x)


def _signature(inputs: Sequence[Any]) -> Signature:
    sig = []
    for x in inputs:
        if isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], int):
            sig.append((np.dtype(x[0]).name if not isinstance(x[0], str) else x[0], x[1]))
        else:
            sig += signature_of([_as_array(x)])
    return tuple(sig)


def kernel(func: Optional[Callable[..., Any]] = None, *, target: Optional[str] = None,
           debug: Optional[bool] = None) -> Union[HybridKernel, Callable[[Callable[..., Any]], HybridKernel]]:
    """Mark a function as a hybrid DSL kernel: ``@kernel`` or ``@kernel(target="python", debug=True)``.

    ``ops.Custom(k)`` of the result needs no func_type; calling it directly runs the Python target.
    """
    if func is None:
        return lambda f: HybridKernel(f, target, debug)
    return HybridKernel(func, target, debug)


ms_kernel = kernel
