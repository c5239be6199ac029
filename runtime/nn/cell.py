"""``nn.Cell``: a module that owns Parameters and sub-cells, run by ``construct``.

Assigning a ``Parameter`` or a ``Cell`` to an attribute registers it (in
assignment order); ``parameters_and_names`` walks them recursively with
dotted names. A cell that defines ``bprop(self, *inputs, out, dout)`` is one
node in the graph: ``construct`` runs with recording off and ``bprop`` gives
the input gradients.
"""
from __future__ import annotations

import threading
import warnings
from collections import OrderedDict
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Tuple

from ..autograd.callback import BpropBackward, needs_grad, record_callback
from ..autograd.grad_mode import _state as _grad_state
from ..autograd.grad_mode import no_grad
from ..context import GRAPH_MODE, _settings
from ..ops.op_entry import op_entry
from ..tensor import Parameter, Tensor, type_label
from .graph_state import CellState

__all__ = ["Cell"]


def _bprop_node(cell: "Cell") -> Optional[str]:
    """The node a traced call of ``cell`` records: one named for its ``bprop``, or None (its ops)."""
    return f"{type(cell).__name__}.bprop" if getattr(type(cell), "bprop", None) is not None else None


def _eager(cell: "Cell") -> Any:
    """What a traced call of ``cell`` runs: ``construct``, or it and ``bprop`` as one node."""
    return cell._eager_call


def _hold(obj: Any) -> None:
    """``obj`` (a Parameter or a Cell) is held by one more cell attribute."""
    obj.__dict__["_holders"] = obj.__dict__.get("_holders", 0) + 1


def _release(obj: Any) -> None:
    if obj is not None and obj.__dict__.get("_holders", 0) > 0:
        obj.__dict__["_holders"] -= 1


def _held_once(cell: "Cell") -> bool:
    """Each cell and Parameter of ``cell``'s part (itself included) is held by one cell attribute only: none
    of them can be anywhere else in the cell it was just assigned to, so only that part needs naming (a
    layer appended to a long list names its own Parameters, not the list's)."""
    for kind, _key, _path, obj in cell.named_from_here():
        if obj.__dict__.get("_holders", 0) != 1:
            return False
    return True


_naming = threading.local()  # keep: sub-cells registered now keep their Parameters' names (nn.container's slices)


@contextmanager
def keeping_names() -> Iterator[None]:
    """Within the block, cells assigned to cells keep their Parameters' names: a slice of a SequentialCell
    is a view of cells another network named, whose names must not change."""
    before = getattr(_naming, "keep", False)
    _naming.keep = True
    try:
        yield
    finally:
        _naming.keep = before


class Cell:
    """Base class of networks. Subclasses define ``construct``."""

    def __init__(self, auto_prefix: bool = True) -> None:
        """``auto_prefix`` (MindSpore's): a sub-cell assigned to this cell gets its attribute name put in
        front of its Parameters' names (``fc1.weight``), so a network's names are unique, as its paths."""
        object.__setattr__(self, "_auto_prefix", bool(auto_prefix))
        object.__setattr__(self, "_params", OrderedDict())
        object.__setattr__(self, "_cells", OrderedDict())
        object.__setattr__(self, "training", False)
        object.__setattr__(self, "_graph_jit", None)  # GRAPH_MODE's jitted construct, made on first use

    def __setattr__(self, name: str, value: Any) -> None:
        params: Dict[str, Parameter] = self.__dict__.get("_params")  # type: ignore[assignment]
        if params is None and isinstance(value, (Parameter, Cell)):
            raise AttributeError(f"cannot assign {type(value).__name__} '{name}' before "
                                 f"Cell.__init__() was called; call super().__init__() first")
        if params is not None:
            if value is not None and params.get(name) is value:  # `self.w -= x` rebinds the same Parameter
                return
            if params.get(name) is not None and not isinstance(value, (Parameter, Cell)) and value is not None:
                # a Tensor for a Parameter's name: new values for it (MindSpore's set_data), not a Tensor in
                # its place, which trainable_params, the optimizer made before and checkpoints would not see
                if not isinstance(value, Tensor):  # (an array, a number: MindSpore's and torch's TypeError)
                    raise TypeError(f"cannot assign a value of type {type_label(value)} to Parameter '{name}' of "
                                    f"{type(self).__name__}: assign a Parameter, a Tensor (its new data), or None "
                                    f"(which removes it)")
                params[name].set_data(value)
                return
            cells = self.__dict__["_cells"]
            # one replacing another of its kind keeps its place in the order (as MindSpore's and torch's)
            _release(params.get(name) if not isinstance(value, Parameter) or params.get(name) is not value
                     else None)
            again = cells.get(name) is value  # the same cell assigned again: held once still
            _release(None if again else cells.get(name))
            if not isinstance(value, Parameter):
                params.pop(name, None)
            if not isinstance(value, Cell):
                cells.pop(name, None)
            if isinstance(value, Parameter):
                if value.name is None:
                    value.name = self._own_prefix() + name
                params[name] = value
                _hold(value)
            elif isinstance(value, Cell):
                # MindSpore's auto_prefix: each Parameter of the sub-cell is named by its path from here, after
                # this cell's own place in the network that named it (_own_prefix), so names are paths
                # whatever the cell was named before (a clone, a reordered container)
                rename = self.__dict__.get("_auto_prefix", True) and not getattr(_naming, "keep", False)
                prefix = self._own_prefix() if rename else ""
                cells[name] = value
                if not again:
                    _hold(value)
                if rename and _held_once(value):  # nothing of it is anywhere else: only its part needs names
                    value._name_parameters(f"{prefix}{name}.")
                elif rename:  # named from this cell: a Parameter it reaches twice (a shared layer, a tied
                    self._name_parameters(prefix)  # weight) by its first place, where a checkpoint's walk meets it
        object.__setattr__(self, name, value)

    def _name_parameters(self, prefix: str) -> None:
        """Name each Parameter of this cell ``prefix`` + its name from here (MindSpore's
        update_parameters_name; see ``named_from_here``), and remember each sub-cell's place."""
        for kind, key, _path, obj in self.named_from_here(prefix):
            if kind == "cell":
                object.__setattr__(obj, "_prefix", key)
            else:
                obj.name = key

    def named_from_here(self, prefix: str = "") -> Iterator[Tuple[str, str, str, Any]]:
        """("cell", name prefix, path, cell) and ("param", name, path, Parameter), depth-first, a cell before
        its children, each object once: the names this cell gives (its path, without the attribute names
        of cells that name nothing, ``auto_prefix=False``). Parameters are named so, and checkpoints keyed
        so (checkpoint.py), so the two always agree."""
        stack: List[Tuple[str, str, Cell]] = [("", prefix, self)]
        walked, done = set(), set()
        while stack:
            path, key, c = stack.pop()
            if id(c) in walked:
                continue
            walked.add(id(c))
            yield "cell", key, path, c
            for n, p in c._params.items():
                if id(p) not in done:
                    done.add(id(p))
                    yield "param", key + n, f"{path}.{n}" if path else n, p
            names = c.__dict__.get("_auto_prefix", True)
            stack.extend((f"{path}.{k}" if path else k, f"{key}{k}." if names else key, child)
                         for k, child in reversed(list(c._cells.items())))

    def _own_prefix(self) -> str:
        """What comes before this cell's paths in its Parameters' names: "" for a cell named at the top,
        "body." for one named as ``net.body``."""
        return self.__dict__.get("_prefix", "")

    def __delattr__(self, name: str) -> None:
        _release(self.__dict__["_params"].pop(name, None))
        _release(self.__dict__["_cells"].pop(name, None))
        object.__delattr__(self, name)

    def construct(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define construct()")

    @op_entry("cell", _bprop_node, target=_eager)
    def __call__(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        """``cell(*args, **kwargs)``: through ``jit`` in GRAPH_MODE, else ``construct`` (with ``bprop``, one
        node). Traced (op_entry), a cell with ``bprop`` is one node; the ops of any other cell are recorded."""
        if _settings["mode"] == GRAPH_MODE:
            return _graph_call(self, args, kwargs)
        return self._eager_call(*args, **kwargs)

    @op_entry("cell", _bprop_node, target=_eager)
    def _call(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        """``_call(*args, **kwargs)``, a call as in PYNATIVE_MODE (or traced): what GRAPH_MODE captures, or
        runs when it cannot."""
        return self._eager_call(*args, **kwargs)

    def _eager_call(self, *args: Any, **kwargs: Any) -> Any:
        bprop = getattr(type(self), "bprop", None)
        # bprop decides the gradients whenever one is recorded, also when only the cell's own Parameters
        # require grad (they then get none from it, as in MindSpore): never autodiff through construct
        if bprop is None or not (needs_grad(args) or (_grad_state.enabled and
                                                      any(p.requires_grad for p in self.get_parameters()))):
            return self.construct(*args, **kwargs)
        return self._call_with_bprop(args, kwargs)

    def _call_with_bprop(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        if kwargs:  # bprop(*inputs, out, dout) takes the inputs positionally: bind keywords to their places
            import inspect
            try:
                bound = inspect.signature(self.construct).bind(*args, **kwargs)
            except TypeError as e:
                raise TypeError(f"{type(self).__name__}: {e}") from None
            bound.apply_defaults()
            if bound.kwargs:
                raise TypeError(f"{type(self).__name__} has a bprop, which takes the inputs positionally; "
                                f"construct's keyword-only arguments {sorted(bound.kwargs)} cannot reach it")
            args, kwargs = tuple(bound.args), {}
        with no_grad():
            out = self.construct(*args, **kwargs)
        single = isinstance(out, Tensor)
        outs = [out] if single else list(out)
        name = f"{type(self).__name__}.bprop"
        backward = BpropBackward(name, args, [o._data for o in outs], single, self.bprop)
        outs = record_callback(name, args, outs, backward)
        return outs[0] if single else type(out)(outs) if isinstance(out, tuple) else outs

    # ---- parameters ------------------------------------------------------
    def parameters_and_names(self, name_prefix: str = "", expand: bool = True) -> Iterator[Tuple[str, Parameter]]:
        """(dotted name, parameter) for every parameter, each once, sub-cells included."""
        seen = set()
        for prefix, cell in self._walk(name_prefix):
            for n, p in cell._params.items():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield (f"{prefix}.{n}" if prefix else n), p
            if not expand:
                break

    def _walk(self, prefix: str) -> Iterator[Tuple[str, "Cell"]]:
        """(dotted name, cell) depth-first, each cell once, a cell before its children (as MindSpore)."""
        stack = [(prefix, self)]
        seen = set()
        while stack:
            p, cell = stack.pop()
            if id(cell) in seen:
                continue
            seen.add(id(cell))
            yield p, cell
            stack.extend((f"{p}.{n}" if p else n, c) for n, c in reversed(list(cell._cells.items())))

    def get_parameters(self, expand: bool = True) -> Iterator[Parameter]:
        for _, p in self.parameters_and_names(expand=expand):
            yield p

    def trainable_params(self, recurse: bool = True) -> List[Parameter]:
        """Parameters that require grad, in registration order."""
        return [p for p in self.get_parameters(expand=recurse) if p.requires_grad]

    def untrainable_params(self, recurse: bool = True) -> List[Parameter]:
        return [p for p in self.get_parameters(expand=recurse) if not p.requires_grad]

    def cells_and_names(self) -> Iterator[Tuple[str, "Cell"]]:
        return self._walk("")

    def name_cells(self) -> "OrderedDict[str, Cell]":
        return OrderedDict(self._cells)

    def set_grad(self, requires_grad: bool = True) -> "Cell":
        """MindSpore's mark of a cell whose gradient is taken; here every call can be differentiated
        (value_and_grad), so it only records the flag and returns the cell."""
        object.__setattr__(self, "requires_grad", bool(requires_grad))
        return self

    def set_train(self, mode: bool = True) -> "Cell":
        for _, c in self._walk(""):
            object.__setattr__(c, "training", mode)
        return self

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={type(c).__name__}" for n, c in self._cells.items())
        return f"{type(self).__name__}({inner})"


def _graph_call(cell: Cell, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """GRAPH_MODE: run the cell through ``jit`` (ms_backend), one graph per signature, kept on the cell.

    Part of the signature: a snapshot of the cell tree's attributes (graph_state.py), so a trace never
    runs with values other than those it read. A cell whose traces keep changing its own attributes
    (``self.calls += 1`` in construct) would trace on every call: after two such traces in a row it
    runs as in PYNATIVE_MODE, with a warning."""
    jitted = cell.__dict__.get("_graph_jit")
    if jitted is None:
        from ..jit import jit
        def run(c: Cell, state: Any, *a: Any, **k: Any) -> Any:  # a call whose trace stops runs eagerly
            return c._call(*a, **k)
        run.__qualname__ = f"{type(cell).__name__}.construct"
        jitted = jit(run)
        jitted.state_writes = 0  # new signatures in a row whose call changed the cell's attributes
        jitted.state_in_key = True  # (its attributes are: `state`)
        object.__setattr__(cell, "_graph_jit", jitted)
    if jitted.state_writes >= _STATE_WRITES:
        return cell._call(*args, **kwargs)
    state = CellState(cell)
    known = len(jitted._cache)
    out = jitted(cell, state, *args, **kwargs)
    if len(jitted._cache) != known:  # a new signature: traced (or run eagerly, its trace stopped)
        if CellState(cell) == state:
            jitted.state_writes = 0
        else:
            jitted.state_writes += 1
            if jitted.state_writes >= _STATE_WRITES:
                warnings.warn(f"GRAPH_MODE: {type(cell).__name__}.construct changes the cell's attributes on "
                              f"every trace; it runs as in PYNATIVE_MODE from now on", RuntimeWarning,
                              stacklevel=4)  # _graph_call, Cell.__call__, its op entry, the caller
    return out


_STATE_WRITES = 2  # traces in a row changing the cell's attributes after which a cell runs eagerly
