"""Operator information for ``ops.Custom``: ``CustomRegOp``, ``DataType``, ``custom_info_register``.

An op-info says which dtype combinations an operator's implementation takes
(one ``dtype_format`` row per combination: inputs, then outputs), its inputs,
outputs and attributes, and the target it is for. ``Custom`` rejects a call
outside the rows with a ``TypeError`` that lists them, and hands the
attributes to aot kernels (``AotExtra::Attr``). The dict ``get_op_info()``
returns has MindSpore's keys, so existing registration code works unchanged.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

__all__ = ["CustomRegOp", "DataType", "custom_info_register", "OpInfo", "parse_reg_info"]

TARGETS = ("CPU", "GPU")
VALUE_TYPES = ("int", "float", "bool", "str", "listInt", "listFloat", "listBool", "listStr", "all")
PARAM_TYPES = ("required", "optional")


class DataType:
    """``(dtype, format)`` pairs for ``CustomRegOp.dtype_format``; ``None_None`` matches any dtype."""

    None_None = ("", "")
    BOOL_Default = ("bool", "DefaultFormat")
    I8_Default = ("int8", "DefaultFormat")
    I16_Default = ("int16", "DefaultFormat")
    I32_Default = ("int32", "DefaultFormat")
    I64_Default = ("int64", "DefaultFormat")
    U8_Default = ("uint8", "DefaultFormat")
    U16_Default = ("uint16", "DefaultFormat")
    U32_Default = ("uint32", "DefaultFormat")
    U64_Default = ("uint64", "DefaultFormat")
    F16_Default = ("float16", "DefaultFormat")
    BF16_Default = ("bfloat16", "DefaultFormat")
    F32_Default = ("float32", "DefaultFormat")
    F64_Default = ("float64", "DefaultFormat")
    C64_Default = ("complex64", "DefaultFormat")
    C128_Default = ("complex128", "DefaultFormat")


_DTYPE_NAMES = {"", "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
                "bfloat16", "float32", "float64", "complex64", "complex128"}


class CustomRegOp:
    """Builder of an op-info: ``CustomRegOp(name).input(0, "x").output(0, "y").dtype_format(...).get_op_info()``."""

    def __init__(self, op_name: str = "Custom") -> None:
        if not isinstance(op_name, str):
            raise TypeError(f"CustomRegOp name must be a str, got {type(op_name).__name__}")
        self.op_name = op_name
        self.inputs: List[Dict[str, Any]] = []
        self.outputs: List[Dict[str, Any]] = []
        self.attr_: List[Dict[str, Any]] = []
        self.dtype_format_: List[List[Tuple[str, str]]] = []
        self.target_: Optional[str] = None

    def input(self, index: Optional[int] = None, name: Optional[str] = None, param_type: str = "required",
              **kwargs: Any) -> "CustomRegOp":
        """Describe input ``index`` (order of the call's arguments); ``inplace=True``: the kernel writes it."""
        self.inputs.append(_io_entry("input", index, name, param_type, kwargs))
        return self

    def output(self, index: Optional[int] = None, name: Optional[str] = None, param_type: str = "required",
               **kwargs: Any) -> "CustomRegOp":
        """Describe output ``index``."""
        self.outputs.append(_io_entry("output", index, name, param_type, kwargs))
        return self

    def dtype_format(self, *args: Tuple[str, str]) -> "CustomRegOp":
        """One supported combination: a ``DataType`` per input, then per output."""
        row = []
        for i, a in enumerate(args):
            if not (isinstance(a, (tuple, list)) and len(a) == 2 and a[0] in _DTYPE_NAMES):
                raise ValueError(f"dtype_format argument {i} is {a!r}; use ops.DataType constants such as "
                                 f"DataType.F32_Default or DataType.None_None")
            row.append((str(a[0]), str(a[1])))
        self.dtype_format_.append(row)
        return self

    def attr(self, name: Optional[str] = None, param_type: Optional[str] = None, value_type: Optional[str] = None,
             default_value: Optional[str] = None, **kwargs: Any) -> "CustomRegOp":
        """An attribute: ``value=`` gives its value (any Python value), ``default_value`` a string
        (lists comma-separated, e.g. ``"1,2,3"``) read as ``value_type``."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"attribute name must be a non-empty str, got {name!r}")
        if param_type is not None and param_type not in PARAM_TYPES:
            raise ValueError(f"attribute '{name}': param_type {param_type!r} is not one of {PARAM_TYPES}")
        if value_type is not None and value_type not in VALUE_TYPES:
            raise ValueError(f"attribute '{name}': value_type {value_type!r} is not one of {VALUE_TYPES}")
        entry: Dict[str, Any] = {"name": name, "param_type": param_type, "value_type": value_type,
                                 "default_value": default_value}
        entry.update(kwargs)
        self.attr_.append(entry)
        return self

    def target(self, target: Optional[str] = None) -> "CustomRegOp":
        """The target this information is for: "CPU" or "GPU"."""
        if target not in TARGETS:
            raise ValueError(f"target {target!r} is not supported; accepted: {', '.join(TARGETS)}")
        self.target_ = target
        return self

    def get_op_info(self) -> Dict[str, Any]:
        """The op-info as a dict (JSON-serializable), to pass as ``reg_info``."""
        n = len(self.inputs) + len(self.outputs)
        for row in self.dtype_format_:
            if (self.inputs or self.outputs) and len(row) != n:
                raise ValueError(f"op-info '{self.op_name}': a dtype_format row has {len(row)} entries, but "
                                 f"{len(self.inputs)} inputs and {len(self.outputs)} outputs were declared")
        return {
            "op_name": self.op_name,
            "imply_type": "",
            "inputs": [dict(e) for e in self.inputs],
            "outputs": [dict(e) for e in self.outputs],
            "attr": [dict(e) for e in self.attr_],
            "dtype_format": [[list(p) for p in row] for row in self.dtype_format_],
            "target": self.target_,
        }


def _io_entry(what: str, index: Optional[int], name: Optional[str], param_type: str,
              kwargs: Dict[str, Any]) -> Dict[str, Any]:
    if index is not None and (not isinstance(index, int) or index < 0):
        raise ValueError(f"{what} index must be a non-negative int, got {index!r}")
    entry: Dict[str, Any] = {"index": index, "name": name, "param_type": param_type}
    entry.update(kwargs)
    return entry


def custom_info_register(*reg_info: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator binding op-infos to a Python function (``Custom``'s ``reg_info=`` wins over it)."""

    def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
        existing = list(getattr(func, "reg_info", []) or [])
        func.reg_info = existing + list(reg_info)  # type: ignore[attr-defined]
        return func

    return decorator


# ---- reading an op-info ---------------------------------------------------

class OpInfo:
    """The parts of one op-info that a call needs: dtype rows, counts, attributes, in-place inputs."""

    def __init__(self, info: Dict[str, Any]) -> None:
        self.op_name: str = info.get("op_name") or "Custom"
        self.n_inputs = len(info.get("inputs") or ())
        self.inplace: Tuple[int, ...] = _inplace_inputs(self.op_name, info.get("inputs") or ())
        self.n_outputs = len(info.get("outputs") or ())
        self.rows: List[Tuple[str, ...]] = [tuple(p[0] for p in row) for row in info.get("dtype_format") or ()]
        self.attrs: List[Dict[str, Any]] = list(info.get("attr") or ())

    def check_dtypes(self, op: str, in_dtypes: Sequence[np.dtype],
                     out_dtypes: Optional[Sequence[np.dtype]]) -> None:
        """TypeError unless (inputs, outputs) dtypes match a row ("" matches anything);
        ``out_dtypes=None`` (outputs not known before the call): the inputs alone must match."""
        if not self.rows:
            return
        nin = len(in_dtypes)
        call = tuple(np.dtype(d).name for d in in_dtypes) + tuple(np.dtype(d).name for d in out_dtypes or ())
        for row in self.rows:
            if out_dtypes is None:
                if len(row) >= nin and all(r == "" or r == c for r, c in zip(row[:nin], call)):
                    return
            elif len(row) == len(call) and all(r == "" or r == c for r, c in zip(row, call)):
                return
        listed = "; ".join(_format_row(row, nin) for row in self.rows)
        raise TypeError(f"{op}: dtypes {_format_row(call, nin)} are not supported by its reg_info "
                        f"'{self.op_name}'; supported (inputs -> outputs): {listed}")

    def attr_values(self, op: str, overrides: Dict[str, Any]) -> Dict[str, Any]:
        """Attribute values: ``add_prim_attr`` values, else ``value=``, else ``default_value``."""
        values: Dict[str, Any] = {}
        for a in self.attrs:
            name = a["name"]
            vt = a.get("value_type")
            if name in overrides:
                values[name] = coerce_attr(op, name, vt, overrides[name])
            elif "value" in a:
                values[name] = coerce_attr(op, name, vt, a["value"])
            elif a.get("default_value") is not None:
                values[name] = parse_default(op, name, vt, a["default_value"])
            elif a.get("param_type") == "required":
                raise ValueError(f"{op}: required attribute '{name}' has no value; give .attr(..., value=...) "
                                 f"or a default_value in its CustomRegOp, or call add_prim_attr('{name}', value)")
        for name, v in overrides.items():
            values.setdefault(name, v)
        return values


def _inplace_inputs(op_name: str, inputs: Sequence[Dict[str, Any]]) -> Tuple[int, ...]:
    """Indices of the inputs declared ``inplace=True`` (by their ``index``, else their position)."""
    out = []
    for k, entry in enumerate(inputs):
        flag = entry.get("inplace", False)
        if not isinstance(flag, bool):
            raise ValueError(f"op-info '{op_name}': input {entry.get('name') or k} has inplace={flag!r}; "
                             f"it must be True or False")
        if flag:
            out.append(k if entry.get("index") is None else int(entry["index"]))
    return tuple(sorted(set(out)))


def _format_row(row: Sequence[str], nin: int) -> str:
    names = [r or "any" for r in row]
    return f"({', '.join(names[:nin])}) -> ({', '.join(names[nin:])})"


_SCALAR_PARSERS: Dict[str, Callable[[str], Any]] = {
    "int": int,
    "float": float,
    "str": str,
    "bool": lambda s: _parse_bool(s),
}


def _parse_bool(s: str) -> bool:
    low = s.strip().lower()
    if low in ("true", "1"):
        return True
    if low in ("false", "0"):
        return False
    raise ValueError(f"{s!r} is not a bool")


def parse_default(op: str, name: str, value_type: Optional[str], text: Any) -> Any:
    """A ``default_value`` string read as ``value_type`` (lists are comma-separated)."""
    if not isinstance(text, str):
        return coerce_attr(op, name, value_type, text)
    try:
        if value_type in _SCALAR_PARSERS:
            return _SCALAR_PARSERS[value_type](text.strip() if value_type != "str" else text)
        if value_type is not None and value_type.startswith("list"):
            item = _SCALAR_PARSERS[value_type[4:].lower()]
            return [item(p.strip()) for p in text.split(",") if p.strip()]
    except ValueError as e:
        raise ValueError(f"{op}: default_value {text!r} of attribute '{name}' is not a {value_type}: {e}") from None
    return text  # value_type "all" or None: the string itself


def coerce_attr(op: str, name: str, value_type: Optional[str], value: Any) -> Any:
    """``value`` converted to ``value_type`` (ValueError if it cannot be)."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    elif isinstance(value, np.generic):
        value = value.item()
    if value_type in (None, "all"):
        return value
    ok = True
    if value_type == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif value_type == "float":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif value_type == "bool":
        ok = isinstance(value, bool)
    elif value_type == "str":
        ok = isinstance(value, str)
    elif value_type.startswith("list"):
        ok = isinstance(value, (list, tuple))
        if ok:
            item = value_type[4:].lower()
            value = [coerce_attr(op, name, item, v) for v in value]
    if not ok:
        raise ValueError(f"{op}: attribute '{name}' is declared {value_type}, got {value!r}")
    return value


def parse_reg_info(reg_info: Any, target: str) -> Optional[OpInfo]:
    """The op-info for ``target`` among ``reg_info`` (a dict, a JSON string, a CustomRegOp, or a list)."""
    items: List[Any] = list(reg_info) if isinstance(reg_info, (list, tuple)) else [reg_info]
    chosen = None
    for item in items:
        info = _as_dict(item)
        t = info.get("target")
        if t is None or t == target:
            if chosen is None or (chosen.get("target") is None and t == target):
                chosen = info
    return OpInfo(chosen) if chosen is not None else None


def _as_dict(item: Union[Dict[str, Any], str, CustomRegOp]) -> Dict[str, Any]:
    if isinstance(item, CustomRegOp):
        return item.get_op_info()
    if isinstance(item, str):
        try:
            item = json.loads(item)
        except ValueError as e:
            raise ValueError(f"reg_info string is not JSON: {e}") from None
    if not isinstance(item, dict):
        raise TypeError(f"reg_info must be the dict from CustomRegOp(...).get_op_info() (or a list of them), "
                        f"got {type(item).__name__}")
    return item
