"""What a trace read besides its arguments, checked on every call that reuses the trace (``Guards``).

A traced graph fixes the Python values the function read: a global, a closure
cell, a class attribute, a field of an object (``self.scale``,
``CFG.scale``), the contents of a global numpy array, which tensor a global
names. Like torch.compile's guards on globals and closures, ``collect`` notes
each such read with the exact key of its value (``signature.exact_key``:
type and exact value; numpy arrays by contents; tensors by identity, since
the graph holds a tensor by reference and sees its in-place writes), and a
call whose reads no longer match traces again (function.py).

What is read is found from the code that can run, before the trace:
the jitted function (a ``functools.partial``, a bound method or a jitted
function unwrapped) and every user function it can reach through its
globals, closure cells, and the objects, classes and modules those hold
(methods and properties named in the code, a Cell's ``construct`` and
``bprop``). The names that code mentions (``co_names``, and identifier
strings, as in ``getattr(obj, "name")``) are the globals and
attributes guarded: a global the code names, and each attribute of that name
of an object reached (an argument such as a method's ``self`` or a Cell,
a global, a closure's value, an element of a list or dict attribute). Code
of the runtime, the standard library and installed packages is not walked
(its modules and functions are guarded by identity where user code names
them).
"""
from __future__ import annotations

import collections
import functools
import os
import sys
import sysconfig
import types
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import numpy as np

from ..tensor import Tensor
from .signature import exact_key

__all__ = ["Guards", "collect", "with_grad_mode", "with_grad_reads"]

_MISSING = object()
_RUNTIME_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LIBRARY_DIRS = tuple(sorted({os.path.abspath(p) + os.sep for p in (
    _RUNTIME_DIR, os.path.join(os.path.dirname(_RUNTIME_DIR), "opbuilder"),
    sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"],
    sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]) if p}))
# values whose key cannot change while the object stays the same (identity is enough on the fast path)
_MUTABLE = (np.ndarray, list, dict, set, tuple, bytearray, collections.deque)
_LIMIT = 512  # guards at most per trace: more and the trace is not cached (it runs eagerly)


class Guards:
    """The reads of one trace: (a dict and a name to read it from, or a function reading it; the object
    read then; whether its contents may change in place; its key then; what it is). ``hold()`` says
    whether every read still gives a value with the same key."""

    __slots__ = ("checks", "where")

    def __init__(self, checks: List[Tuple[Any, str, Optional[Callable[[], Any]], Any, bool, Any, str]]) -> None:
        self.checks = tuple(checks)
        self.where: Optional[str] = None  # the first read that changed, after a failed ``hold()``

    def hold(self) -> bool:
        for d, name, read, obj, mutable, key, what in self.checks:
            v = d.get(name, _MISSING) if read is None else read()
            if v is obj and not mutable:  # the same object, whose key cannot have changed
                continue
            try:
                same = _key(v) == key
            except Exception:  # noqa: BLE001  (an == that is elementwise, say: treat it as changed)
                same = False
            if not same:
                self.where = what
                return False
        return True

    def rebound(self, every: bool = False) -> Any:
        """The first read that now gives another object, with another key (what the trace rebound:
        ``self.running = ...``, a global, one it created), or None; or a numpy array, or a list or dict
        holding tensors or arrays, changed in place (``self.state["m"] = ...``). A list of plain values
        changed in place is not one: Python's side effects run at trace time only. With ``every``: the
        list of all of them."""
        found = []
        for d, name, read, obj, mutable, key, what in self.checks:
            v = d.get(name, _MISSING) if read is None else read()
            if v is obj and not (mutable and _holds_state(v)):
                continue
            try:
                same = _key(v) == key
            except Exception:  # noqa: BLE001
                same = False
            if not same:
                if not every:
                    return what
                found.append(what)
        return found if every else None

    def __len__(self) -> int:
        return len(self.checks)


def _key(v: Any) -> Any:
    if v is _MISSING:
        return ("missing",)
    if isinstance(v, collections.deque):  # (unhashable: by its contents, as a list's)
        return ("deque", v.maxlen, _key(list(v)))
    try:
        return exact_key(v)
    except Exception:  # noqa: BLE001  (an object whose hash or contents cannot be read: by identity)
        return ("id", id(v), v)


_lib_cache: Dict[str, bool] = {}


def _library_file(name: Optional[str]) -> bool:
    if not name:
        return True
    if name.startswith("<"):
        return name.startswith("<frozen")
    hit = _lib_cache.get(name)
    if hit is None:
        hit = _lib_cache[name] = os.path.abspath(name).startswith(_LIBRARY_DIRS)
    return hit


def _library_module(modname: Optional[str]) -> bool:
    mod = sys.modules.get(modname or "")
    if mod is None:
        return True
    return _library_file(getattr(mod, "__file__", None))


def _library_module_object(m: types.ModuleType) -> bool:
    """A module of the runtime, the standard library or an installed package (built-in and frozen modules
    have a spec but no file); a module made at runtime (``types.ModuleType(...)``, no spec) is user state."""
    f = getattr(m, "__file__", None)
    if f is None:
        return getattr(m, "__spec__", None) is not None
    return _library_file(f)


def _class_attr(cls: type, name: str) -> Any:
    for k in cls.__mro__:
        d = k.__dict__
        if name in d:
            return d[name]
    return _MISSING


def _attr(obj: Any, name: str) -> Any:
    """``obj.name`` as plain storage: the instance's own value, else its class's (no getter runs); a
    ``__slots__`` field's value through its slot (unset: missing)."""
    d = getattr(obj, "__dict__", None)
    if d is not None and name in d:
        return d[name]
    v = _class_attr(type(obj), name)
    if type(v) is types.MemberDescriptorType:  # a __slots__ field: the instance's value is in the slot
        try:
            return v.__get__(obj, type(obj))
        except AttributeError:
            return _MISSING
    return v


def _cell_contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return _MISSING


def _is_cell(v: Any) -> bool:
    from ..nn.cell import Cell
    return isinstance(v, Cell)


def _cell_state(cell: Any) -> Any:
    from ..nn.graph_state import CellState
    return CellState(cell)


def _code_names(code: types.CodeType) -> Set[str]:
    names: Set[str] = set()
    stack = [code]
    while stack:
        c = stack.pop()
        names.update(c.co_names)
        for k in c.co_consts:
            if isinstance(k, types.CodeType):
                stack.append(k)
            elif isinstance(k, str) and k.isidentifier():  # getattr(obj, "name")
                names.add(k)
    return names


class _Walk:
    """One pass over what the code can reach; ``names`` grows as user code is found."""

    def __init__(self, names: Set[str], checks: Optional[List[Any]], missing: bool = False) -> None:
        self.names = names
        self.checks = checks  # None: only discover names
        self.missing = missing  # note the names not there yet too (a trace that creates one rebinds it)
        self.seen: Set[int] = set()
        self.keep: List[Any] = []  # what ``seen`` holds ids of, alive for the walk

    def _guard(self, read: Callable[[], Any], what: str, d: Any = None, name: str = "") -> Any:
        """Note a read: ``d.get(name)`` when ``d`` (a globals or module dict) is given, else ``read()``."""
        v = read()
        if self.checks is not None and (self.missing or len(self.checks) <= _LIMIT):  # (before a trace: all)
            self.checks.append((d, name, None if d is not None else read, v, isinstance(v, _MUTABLE), _key(v),
                                what))
        return v

    def function(self, f: Any) -> None:
        if id(f) in self.seen:
            return
        self.seen.add(id(f))
        self.keep.append(f)
        if isinstance(f, functools.partial):  # its arguments are read on each call (keywords is a dict)
            self._guard(lambda p=f: p.func, "the function of a functools.partial")
            self.function(f.func)
            self._guard(lambda p=f: p.args, "the arguments of a functools.partial")
            self._guard(lambda p=f: dict(p.keywords), "the keyword arguments of a functools.partial")
            for a in (*f.args, *f.keywords.values()):
                self.value(a)
            return
        if isinstance(f, types.MethodType):
            self.function(f.__func__)
            self.value(f.__self__)
            return
        inner = getattr(f, "fn", None)  # a jitted function: what it runs
        if inner is not None and type(f).__name__ == "JitFunction":
            self.function(inner)
            return
        if not isinstance(f, types.FunctionType):
            self.seen.discard(id(f))  # another callable (a Cell, an object with __call__): what it holds
            self.value(f)
            return
        if _library_file(f.__code__.co_filename):
            return
        code = f.__code__
        # what a call reads besides the code's names: its code, default values and keyword-only defaults
        self._guard(lambda f=f: f.__code__, f"the code of {f.__qualname__}")
        for a in ("__defaults__", "__kwdefaults__"):
            if getattr(f, a) is not None:
                self.value(self._guard(lambda f=f, a=a: getattr(f, a), f"{a} of {f.__qualname__}"))
        own = _code_names(code)
        self.names.update(own)
        g = f.__globals__
        for n in sorted(own):
            if n in g:
                v = self._guard(lambda g=g, n=n: g.get(n, _MISSING), f"global {n!r} of {f.__qualname__}", g, n)
                self.value(v)
            elif self.missing and n in code.co_names:
                self._guard(lambda g=g, n=n: g.get(n, _MISSING), f"global {n!r} of {f.__qualname__}", g, n)
        for name, cell in zip(code.co_freevars, f.__closure__ or ()):
            v = self._guard(lambda c=cell: _cell_contents(c), f"closure variable {name!r} of {f.__qualname__}")
            self.value(v)

    def value(self, v: Any) -> None:
        t = type(v)
        if t in (int, float, str, bool, bytes, complex, type(None)) or isinstance(v, np.ndarray):
            return
        if isinstance(v, Tensor):  # (a .grad it reads is told by the trace itself: function.py)
            return
        if id(v) in self.seen:
            return
        if isinstance(v, (list, tuple, set, frozenset)):
            self.seen.add(id(v))
            self.keep.append(v)
            for x in v:
                self.value(x)
            return
        if isinstance(v, dict):
            self.seen.add(id(v))
            self.keep.append(v)
            for x in v.values():
                self.value(x)
            return
        if isinstance(v, (types.FunctionType, types.MethodType, functools.partial)) or \
                type(v).__name__ == "JitFunction":
            self.function(v)
            return
        if isinstance(v, (property,)):
            for f in (v.fget, v.fset):
                if f is not None:
                    self.function(f)
            return
        if isinstance(v, (staticmethod, classmethod)):
            self.function(v.__func__)
            return
        if isinstance(v, types.ModuleType):
            self.seen.add(id(v))
            self.keep.append(v)
            if _library_module_object(v):
                return
            d = v.__dict__
            for n in sorted(self.names):
                if n in d:
                    self.value(self._guard(lambda d=d, n=n: d.get(n, _MISSING), f"{v.__name__}.{n}", d, n))
            return
        if isinstance(v, type):
            self.seen.add(id(v))
            self.keep.append(v)
            if _library_module(v.__module__):
                return
            for n in sorted(self.names):
                if _class_attr(v, n) is not _MISSING:
                    self.value(self._guard(lambda c=v, n=n: _class_attr(c, n), f"{v.__qualname__}.{n}"))
            return
        cls = type(v)
        if _library_module(cls.__module__):
            if _is_cell(v):  # a runtime Cell (nn.Dense...): its code is not walked, so its whole state
                self.seen.add(id(v))
                self.keep.append(v)
                self._guard(lambda c=v: _cell_state(c), f"the attributes of a {cls.__qualname__}")
                for sub in (v.__dict__.get("_cells") or {}).values():  # user cells it holds (SequentialCell):
                    self.value(sub)  # their code and fields, as if held directly
            elif isinstance(getattr(v, "__dict__", None), dict) and id(v) not in self.seen:
                # an instance of a library class that holds fields (types.SimpleNamespace, argparse's
                # Namespace...): its code is not walked, but the fields user code names are guarded
                self.seen.add(id(v))
                self.keep.append(v)
                self._fields(v, cls)
            return
        self.seen.add(id(v))
        self.keep.append(v)
        for m in ("construct", "bprop", "__call__"):  # a Cell, a callable object: the code its call runs
            f = _class_attr(cls, m)
            if isinstance(f, types.FunctionType):
                self.function(f)
        self.value(cls)
        self._fields(v, cls)

    def _fields(self, v: Any, cls: type) -> None:
        """Guard the attributes of ``v`` the code names: its own (``__dict__`` or ``__slots__``) or its
        class's (which one it may later set)."""
        d = getattr(v, "__dict__", None)
        for n in sorted(self.names):
            if (d is not None and n in d) or _class_attr(cls, n) is not _MISSING:
                self.value(self._guard(lambda o=v, n=n: _attr(o, n), f"attribute {n!r} of a {cls.__qualname__}"))
            elif self.missing and d is not None:
                self._guard(lambda o=v, n=n: _attr(o, n), f"attribute {n!r} of a {cls.__qualname__}")


def collect(fn: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any],
            missing: bool = False) -> Optional[Guards]:
    """The reads of a trace of ``fn(*args, **kwargs)`` to guard (None when there is nothing to guard),
    taken before the trace runs: the values it will read. With ``missing`` (before a trace, to see what
    it rebinds) the globals and fields its code names that are not there yet too."""
    names: Set[str] = set()
    roots = list(args) + list(kwargs.values())
    size = -1
    while size != len(names):  # names found in code reached through an attribute may reach more
        size = len(names)
        w = _Walk(names, None)
        w.function(fn)
        for a in roots:
            w.value(a)
    checks: List[Any] = []
    w = _Walk(names, checks, missing)
    w.function(fn)
    for a in roots:
        w.value(a)
    return Guards(checks) if checks else None


_PLAIN = (int, float, complex, str, bytes, bool, type(None))


def _holds_state(v: Any, depth: int = 0) -> bool:
    """Whether ``v`` changed in place is state a replay would not update: a numpy array, or a container
    holding anything but plain Python values (tensors, arrays, objects; an optimizer's {"w": {"m": t}}).
    A list of plain values (``calls.append(1)``) is not: Python's side effects run at trace time only."""
    if isinstance(v, _PLAIN):
        return False
    if depth > 8 or not isinstance(v, (list, tuple, dict, set, frozenset, collections.deque)):
        return True
    items = v.values() if isinstance(v, dict) else v
    return any(_holds_state(x, depth + 1) for x in items)


def with_grad_reads(guards: Optional[Guards], reads: List[Tuple[Tensor, Any]]) -> Guards:
    """``guards`` and which tensor each ``.grad`` the trace read (``(tensor, its .grad then)``, held tensors,
    not arguments) is."""
    checks = list(guards.checks if guards is not None else ())
    for t, g in {id(t): (t, g) for t, g in reads}.values():
        checks.append((None, "", lambda t=t: t.grad, g, False, _key(g), f"the .grad of a {type(t).__name__} "
                                                                         f"of shape {t.shape}"))
    return Guards(checks)


def with_grad_mode(guards: Optional[Guards], enabled: bool) -> Guards:
    """``guards`` and the grad mode: a function that read it (``is_grad_enabled()``) may branch on it."""
    from ..autograd.grad_mode import _state
    check = (None, "", lambda s=_state: s.enabled, enabled, False, _key(enabled), "the grad mode (is_grad_enabled())")
    return Guards(list(guards.checks if guards is not None else ()) + [check])


def too_many(guards: Optional[Guards]) -> bool:
    """More reads than are checked per call (``_LIMIT``): such a trace is not cached."""
    return guards is not None and len(guards) > _LIMIT
