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


def _cell_entries(cell: Any, who: str) -> List[Tuple[str, Any]]:
    """A cell's checkpoint entries: each Parameter under the name MindSpore's naming gives it from this
    cell, worked out from the cell's structure now (not read from ``Parameter.name``, which another
    container built from these cells may have changed since): its path, without the attribute names of
    cells that name nothing (``auto_prefix=False``: TrainOneStepCell, WithLossCell). So a train
    wrapper's checkpoint loads into the bare network, as in MindSpore, and a network's own into a fresh
    one built the same way. Two Parameters under one name are an error: a load could not tell them apart."""
    out, seen = [], {}
    for kind, name, where, p in cell.named_from_here():
        if kind != "param":
            continue
        if name in seen:
            raise ValueError(f"{who}: parameters {seen[name]!r} and {where!r} are both named {name!r}; give one "
                             f"another name, or hold their cells in a cell that names them (auto_prefix=True)")
        seen[name] = where
        out.append((name, p))
    return out


def _optimizer_states(cell: Any, entries: List[Tuple[str, Any]], who: str) -> List[Tuple[str, Any, List[str],
                                                                                      Dict[str, Any]]]:
    """(name prefix, optimizer, its parameters' names, its state by name) for each optimizer a cell or the
    cells under it hold as an attribute (TrainOneStepCell's), each once: their state goes into the cell's
    checkpoint and comes back from it, as in MindSpore, where an optimizer is a Cell of the training cell.

    Named as MindSpore names a sub-cell's Parameters: the prefix is the holding cell's (``named_from_here``),
    plus the attribute's name where that cell names its parts. So a TrainOneStepCell (which names nothing)
    saved itself gives ``global_step``, ``moment1.<name>``; held as ``self.tg`` of a model, ``tg.global_step``;
    a cell holding ``self.opt_g`` and ``self.opt_d`` gives ``opt_g.global_step`` and ``opt_d.global_step``.
    Each buffer is named after its parameter's name in ``entries`` (the cell's checkpoint names), so the
    names agree with the weights' whatever containers renamed the Parameters since. A state name that is
    also a parameter's is an error: a load could not tell them apart."""
    from .nn.optim import Optimizer
    by_id = {id(p): n for n, p in entries}
    taken = set(by_id.values())
    out: List[Tuple[str, Any, List[str], Dict[str, Any]]] = []
    for kind, key, _path, c in cell.named_from_here():
        if kind != "cell":
            continue
        parts = c.__dict__.get("_auto_prefix", True)
        for attr, v in vars(c).items():
            if not isinstance(v, Optimizer) or any(v is o for _, o, _, _ in out):
                continue
            prefix = key + (attr + "." if parts else "")
            own: List[str] = []
            names = []
            for k, p in enumerate(v._params):
                n = by_id.get(id(p))
                if n is None:  # a parameter the cell does not hold: the optimizer's own name for it
                    own = own or v._param_names()
                    n = own[k]
                names.append(n)
            state = v._state(names)
            clash = [prefix + n for n in state if prefix + n in taken]
            if clash:
                raise ValueError(f"{who}: {clash[0]!r} names both a parameter of the cell and the state of its "
                                 f"optimizer {type(v).__name__} (held as {attr!r}); rename the parameter")
            out.append((prefix, v, names, state))
    return out


def _named(save_obj: Any) -> Dict[str, np.ndarray]:
    from .nn.cell import Cell
    from .nn.optim import Optimizer
    if isinstance(save_obj, Cell):
        items = _cell_entries(save_obj, "save_checkpoint")
        items += [(key + n, a) for key, _, _, state in _optimizer_states(save_obj, items, "save_checkpoint")
                  for n, a in state.items()]
    elif isinstance(save_obj, Optimizer):
        items = list(save_obj.parameters_and_names())
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
    else:
        named = _cell_entries(net, "load_param_into_net")
        states = _optimizer_states(net, named, "load_param_into_net")  # a training cell's: loaded with it
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
                state_in[name] = _step(value) if name == "global_step" else _checked(key + name, value, current)
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


def _step(value: Any) -> np.ndarray:
    arr = value._data if isinstance(value, Tensor) else np.asarray(value)
    if arr.dtype.kind not in "iu" or arr.size != 1 or int(arr.reshape(-1)[0]) < 0:
        raise ValueError(f"load_param_into_net: 'global_step' must be one non-negative integer, got "
                         f"{arr.dtype} of shape {list(arr.shape)}")
    return arr
