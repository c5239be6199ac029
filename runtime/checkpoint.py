"""Checkpoints as safetensors files: ``save_checkpoint``, ``load_checkpoint``, ``load_param_into_net``.

A checkpoint maps a parameter's path in its cell (``body.0.weight``, from
``parameters_and_names``) to its values, in the safetensors format, so other
tools (``safetensors.numpy.load_file``) read it. A save writes a temporary
file beside the target, flushes it to disk and renames it over the target, so
a crash never leaves a half-written checkpoint under the real name. A file
that is truncated or not a safetensors file is a ``ValueError`` naming it; an
entry in a dtype this runtime cannot hold (F8_*) is a ``TypeError`` naming
the entry and the dtype. BF16 entries (from PyTorch, MindSpore, JAX) load as
``bfloat16`` (ml_dtypes' numpy type) and save back as BF16; the format has no
complex128, so saving one is a ``TypeError``. ``__metadata__`` is the format's own header entry, so
no parameter may be named so: such a save is refused before anything is written.
"""
from __future__ import annotations

import logging
import os
import tempfile
from typing import Any, Dict, List, Tuple, Union

import numpy as np

from . import device as _device
from .dtypes import GRAD_KINDS
from .tensor import Parameter, Tensor
from .versions import rebind

__all__ = ["save_checkpoint", "load_checkpoint", "load_param_into_net"]

PathLike = Union[str, "os.PathLike[str]"]
RESERVED_NAMES = ("__metadata__",)  # keys of the safetensors header that are not tensors


def _st():
    """safetensors.numpy, imported on first use (it is a dependency of the package, not of ``import runtime``)."""
    try:
        import safetensors.numpy as st
    except ImportError as e:  # pragma: no cover - the package depends on it
        raise ImportError("checkpoints need the 'safetensors' package: pip install safetensors") from e
    return st


# the safetensors dtypes load_checkpoint reads, as numpy dtypes (BF16: ml_dtypes, imported when met)
_NP_OF = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "U16": np.uint16, "I16": np.int16,
          "F16": np.float16, "BF16": None, "U32": np.uint32, "I32": np.int32, "F32": np.float32,
          "U64": np.uint64, "I64": np.int64, "F64": np.float64, "C64": np.complex64}
LOADABLE_DTYPES = tuple(_NP_OF)


def _load_arrays(data: bytes) -> Dict[str, np.ndarray]:
    """The file's arrays: safetensors parses and checks the file, the dtypes are mapped here
    (safetensors.numpy has no BF16)."""
    out = {}
    for name, view in _st().deserialize(data):
        code = view["dtype"]
        if code == "BF16":
            from .dtypes import bfloat16
            dt = bfloat16.np
        else:
            dt = np.dtype(_NP_OF[code]).newbyteorder("<")  # KeyError: a dtype it lacks (_check_dtypes names it)
        arr = np.frombuffer(view["data"], dtype=dt).reshape(view["shape"])
        out[name] = arr if arr.dtype.isnative else arr.astype(arr.dtype.newbyteorder("="))
    return out


State = Tuple[str, Any, List[str], Dict[str, Any]]  # (name prefix, optimizer, its parameters' names, state)


def _cell_checkpoint(cell: Any, who: str) -> Tuple[List[Tuple[str, Any]], List[State]]:
    """A cell's checkpoint entries and the state of the optimizers it holds, each name checked unique.

    Parameters: each under the name MindSpore's naming gives it from this cell, worked out from the cell's
    structure now (not read from ``Parameter.name``, which another container built from these cells may
    have changed since): its path, without the attribute names of cells that name nothing
    (``auto_prefix=False``: TrainOneStepCell, WithLossCell). So a train wrapper's checkpoint loads into
    the bare network, as in MindSpore, and a network's own into a fresh one built the same way.

    Optimizers: each one a cell or a cell under it holds as an attribute (TrainOneStepCell's), or in a
    list or tuple attribute, once. As in MindSpore, where an optimizer is a Cell of the training cell, its
    parameters are the cell's too (one the cell does not hold otherwise, a learnt loss weight, is saved
    under the optimizer's name for it), and its state is named as MindSpore names a sub-cell's
    Parameters: the holding cell's prefix, plus the attribute's name (and list index) where that cell
    names its parts. A TrainOneStepCell saved itself gives ``global_step``, ``moment1.<name>``; held as
    ``self.tg`` of a model, ``tg.global_step``; ``self.opt_g`` of a cell, ``opt_g.global_step``. Each
    buffer is named after its parameter's checkpoint name, so state and weights agree whatever
    containers renamed the Parameters since. Two entries under one name are an error: a load could not
    tell them apart."""
    from .nn.optim import Optimizer
    entries: List[Tuple[str, Any]] = []
    owner: Dict[str, str] = {}  # name -> what has it (a parameter's path, or a description), for a clash

    def claim(name: str, what: str) -> None:
        if name in owner:
            first = owner[name]
            if " " in first or " " in what:  # a description, not only a parameter's path
                both = " and ".join(w if " " in w else f"parameter {w!r}" for w in (first, what))
            else:
                both = f"parameters {first!r} and {what!r}"
            raise ValueError(f"{who}: {both} are both named {name!r}; give one another name, or hold their cells in "
                             f"a cell that names them (auto_prefix=True)")
        owner[name] = what

    held: List[Tuple[str, Any, str]] = []  # (prefix, optimizer, how it is held)
    for kind, name, where, obj in cell.named_from_here():
        if kind == "param":
            claim(name, where)
            entries.append((name, obj))
            continue
        parts = obj.__dict__.get("_auto_prefix", True)
        for attr, v in vars(obj).items():
            opts = [(attr, v)] if isinstance(v, Optimizer) else \
                [(f"{attr}.{k}", o) for k, o in enumerate(v) if isinstance(o, Optimizer)] \
                if isinstance(v, (list, tuple)) else []
            for at, o in opts:
                if all(o is not h for _, h, _ in held):
                    path = f"{where}.{at}" if where else at
                    held.append((name + (at + "." if parts else ""), o, f"{type(o).__name__} {path!r}"))
    by_id = {id(p): n for n, p in entries}
    for prefix, opt, what in held:  # parameters only an optimizer holds are the cell's too
        own: List[str] = []
        for k, p in enumerate(opt._params):
            if id(p) not in by_id:
                own = own or opt._param_names()
                claim(own[k], f"parameter {k} of optimizer {what}")
                entries.append((own[k], p))
                by_id[id(p)] = own[k]
    states: List[State] = []
    for prefix, opt, what in held:
        names = [by_id[id(p)] for p in opt._params]
        state = opt._state(names)
        for n in state:
            claim(prefix + n, f"the state of optimizer {what}")
        states.append((prefix, opt, names, state))
    return entries, states


def _named(save_obj: Any) -> Dict[str, np.ndarray]:
    from .nn.cell import Cell
    from .nn.optim import Optimizer
    if isinstance(save_obj, Cell):
        items, states = _cell_checkpoint(save_obj, "save_checkpoint")
        items += [(key + n, a) for key, _, _, state in states for n, a in state.items()]
    elif isinstance(save_obj, Optimizer):
        items = list(save_obj.parameters_and_names())
        _check_state_names(save_obj, save_obj._state(), "save_checkpoint")
    elif isinstance(save_obj, dict):
        items = list(save_obj.items())
    elif isinstance(save_obj, (list, tuple)):
        items = []
        for k, entry in enumerate(save_obj):
            if isinstance(entry, Parameter):
                if not entry.name:
                    raise ValueError(f"save_checkpoint: parameter {k} of the list has no name")
                items.append((entry.name, entry))
            elif isinstance(entry, dict) and "name" in entry and "data" in entry:
                items.append((entry["name"], entry["data"]))
            else:
                raise TypeError(f"save_checkpoint: list entries must be Parameters or {{'name': ..., 'data': ...}} "
                                f"dicts, got {type(entry).__name__}")
    else:
        raise TypeError(f"save_checkpoint: save_obj must be a Cell, an optimizer, a list of Parameters or a dict, "
                        f"got {type(save_obj).__name__}")
    out: Dict[str, np.ndarray] = {}
    for name, value in items:
        if not isinstance(name, str):
            raise TypeError(f"save_checkpoint: names must be strings, got {type(name).__name__}")
        if name in out:
            raise ValueError(f"save_checkpoint: the name {name!r} appears twice")
        if name in RESERVED_NAMES:
            raise ValueError(f"save_checkpoint: the name {name!r} is reserved by the safetensors format (its "
                             f"header's metadata); rename that entry. Nothing was written")
        arr = value._data if isinstance(value, Tensor) else value
        arr = _device.to_device(arr, _device.CPU) if _device.is_device_array(arr) else np.asarray(arr)  # the file's
        if arr.dtype == np.complex128:
            raise TypeError(f"save_checkpoint: {name!r} is complex128, which the safetensors format cannot hold "
                            f"(its only complex dtype is C64); cast it to complex64 or save its real and "
                            f"imaginary parts. Nothing was written")
        out[name] = arr if arr.flags.c_contiguous else arr.copy(order="C")  # (ascontiguousarray makes 0-d 1-d)
    return out


def save_checkpoint(save_obj: Any, ckpt_file_name: PathLike) -> None:
    """Write the parameters of a Cell (or a list of Parameters, or a name -> array dict) to a
    safetensors file, atomically (a temporary file renamed over the target). An optimizer writes its
    parameters and its state (``global_step``, ``moment1.<name>`` ...), to resume training from."""
    tensors = _named(save_obj)
    path = os.fspath(ckpt_file_name)
    if os.path.isdir(path):
        raise IsADirectoryError(f"save_checkpoint: {path} is a directory; give the path of the file to write "
                                f"(e.g. {os.path.join(path, 'model.safetensors')})")
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as open() would have made it, not mkstemp's 0600
        with os.fdopen(fd, "wb") as f:
            f.write(_st().save(tensors, metadata={"format": "np"}))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def load_checkpoint(ckpt_file_name: PathLike) -> Dict[str, Parameter]:
    """The checkpoint's parameters by name, each a Parameter named so (integer ones do not require grad)."""
    path = os.fspath(ckpt_file_name)
    with open(path, "rb") as f:  # a missing file: FileNotFoundError naming it
        data = f.read()
    try:
        arrays = _load_arrays(data)
    except Exception as e:  # safetensors raises its own SafetensorError, or others on garbage
        _check_dtypes(path, data)
        raise ValueError(f"{path} is not a readable checkpoint: the file is truncated or corrupt, or not a "
                         f"safetensors file ({type(e).__name__}: {e})") from None
    return {name: Parameter(arr, name=name, requires_grad=arr.dtype.kind in GRAD_KINDS)
            for name, arr in arrays.items()}


_HEADER_LEN = 8  # a safetensors file starts with its JSON header's length, a little-endian uint64


def _check_dtypes(path: str, data: bytes) -> None:
    """Raise a TypeError naming the first entry whose dtype load_checkpoint cannot load (F8_* ...),
    if the header is readable JSON and has one; else return (the file is then reported as corrupt)."""
    import json

    if len(data) < _HEADER_LEN:
        return
    size = int.from_bytes(data[:_HEADER_LEN], "little")
    try:
        header = json.loads(data[_HEADER_LEN:_HEADER_LEN + size])
    except ValueError:
        return
    if not isinstance(header, dict):
        return
    for name, entry in header.items():
        dtype = entry.get("dtype") if isinstance(entry, dict) and name not in RESERVED_NAMES else None
        if isinstance(dtype, str) and dtype not in LOADABLE_DTYPES:
            raise TypeError(f"{path}: entry {name!r} has dtype {dtype}, which load_checkpoint cannot load "
                            f"(supported: {', '.join(LOADABLE_DTYPES)})") from None


def load_param_into_net(net: Any, parameter_dict: Dict[str, Any],
                        strict_load: bool = False) -> Tuple[List[str], List[str]]:
    """Copy each checkpoint entry into the net's parameter of the same path, in place.

    Returns (the net's parameters not loaded, the checkpoint's entries not used), as MindSpore 2.x.
    A shape or dtype mismatch is an error naming the parameter, raised before anything is written;
    ``strict_load=True`` also refuses any name left over on either side. ``net`` may be an optimizer
    (what ``save_checkpoint(optimizer, path)`` wrote): its parameters and its state are loaded; the
    state is all or nothing (part of it would resume a different run), so an incomplete one is an error.
    """
    from .nn.cell import Cell
    from .nn.optim import Optimizer
    if not isinstance(net, (Cell, Optimizer)):
        raise TypeError(f"load_param_into_net: net must be a Cell or an optimizer, got {type(net).__name__}")
    if not isinstance(parameter_dict, dict):
        raise TypeError(f"load_param_into_net: parameter_dict must be a dict, got {type(parameter_dict).__name__}")
    if isinstance(net, Optimizer):
        named = [(n, p) for n, p in zip(net._param_names(), net.parameters)]
        states = [("", net, None, net._state())]
        _check_state_names(net, states[0][3], "load_param_into_net")
    else:
        named, states = _cell_checkpoint(net, "load_param_into_net")  # a training cell's optimizers too
    updates = []
    for name, p in named:
        if name not in parameter_dict:
            continue
        updates.append((p, _checked(name, parameter_dict[name], p._data)))
    loads, skipped = [], set()
    for key, opt, names, state in states:
        state_in = {}
        for name, current in state.items():
            if key + name in parameter_dict:
                value = parameter_dict[key + name]
                state_in[name] = _step(key + name, value) if name == "global_step" else \
                    _checked(key + name, value, current)
        if state_in and len(state_in) != len(state):
            missing = [key + n for n in state if n not in state_in]
            if net is opt:  # an optimizer's own checkpoint: part of its state would resume another run
                raise ValueError(f"load_param_into_net: the checkpoint holds part of the optimizer's state; "
                                 f"missing: {missing}. Nothing was loaded")
            # a cell's: another optimizer's state (Adam's into Momentum's shares only global_step): that
            # optimizer keeps its state, all of which is listed as not loaded (MindSpore loads what matches)
            skipped |= {key + n for n in state}
        elif state_in:
            loads.append((opt, state_in, names))
    net_names = [n for n, _ in named] + [key + n for key, _, _, state in states for n in state]
    not_loaded = [n for n in net_names if n not in parameter_dict or n in skipped]
    known = set(net_names)
    unused = [n for n in parameter_dict if n not in known or n in skipped]
    if strict_load and (not_loaded or unused):
        raise ValueError(f"load_param_into_net(strict_load=True): the net's parameters not in the checkpoint: "
                         f"{not_loaded}; the checkpoint's entries not in the net: {unused}")
    if not_loaded:  # as MindSpore's, which logs them: a half-resume is easy to miss in the returned lists
        logging.getLogger("runtime").warning(
            "load_param_into_net: %d of the net's parameters and optimizer state are not loaded, because they "
            "are not in the checkpoint (check that the network was built as when it was saved): %s",
            len(not_loaded), not_loaded)
    for p, arr in updates:  # checked first, then written: a mismatch leaves the net unchanged
        arr = _device.to_device(arr, _device.device_of(p._data))  # a host checkpoint into GPU parameters too
        if _device.writeable(p._data):
            np.copyto(p._data, arr)
        else:
            rebind(p, arr.copy())  # memory of its own now: its old views keep their counter
        p._version += 1
    for opt, state_in, names in loads:
        opt._load_state(state_in, names)
    return not_loaded, unused


def _checked(name: str, value: Any, current: np.ndarray) -> np.ndarray:
    """``value``'s array, after checking it has ``current``'s shape and dtype."""
    arr = value._data if isinstance(value, Tensor) else np.asarray(value)
    if arr.shape != current.shape:
        raise ValueError(f"load_param_into_net: {name!r} has shape {list(arr.shape)} in the checkpoint and "
                         f"{list(current.shape)} in the net")
    if arr.dtype != current.dtype:
        raise TypeError(f"load_param_into_net: {name!r} is {arr.dtype} in the checkpoint and "
                        f"{current.dtype} in the net")
    return arr


def _check_state_names(opt: Any, state: Dict[str, Any], who: str) -> None:
    """An optimizer's own checkpoint: a parameter named as its state (``global_step``) is an error."""
    clash = [n for n in opt._param_names() if n in state]
    if clash:
        raise ValueError(f"{who}: {clash[0]!r} names both a parameter of optimizer {type(opt).__name__} and its "
                         f"state; rename the parameter")


def _step(name: str, value: Any) -> np.ndarray:
    arr = value._data if isinstance(value, Tensor) else np.asarray(value)
    if arr.dtype.kind not in "iu" or arr.size != 1:
        raise ValueError(f"load_param_into_net: {name!r} must be one non-negative integer, got "
                         f"{arr.dtype} of shape {list(arr.shape)}")
    if int(arr.reshape(-1)[0]) < 0:
        raise ValueError(f"load_param_into_net: {name!r} must be one non-negative integer, got "
                         f"{int(arr.reshape(-1)[0])}")
    return arr
