"""The memory behind an aot kernel's ``extra`` pointer (``AotExtra`` in include/opbuilder/aot.h).

One ``ExtraBlock`` per ``Custom`` op: the attribute records built from Python
values, the kernel data and workspace sizes an ``<Symbol>Init`` sets, and the
error text ``AotExtra::Attr`` records during Init (a kernel call gets a copy
of this header with an error buffer of its own: aot_call.cpp). The ctypes layout mirrors
``opbuilder::aot::ExtraData``; the call path checks both agree in size and
ABI version when it is loaded.
"""
from __future__ import annotations

import ctypes
from typing import Any, Dict, List, Tuple

__all__ = ["ExtraBlock", "ExtraData", "ABI_VERSION"]

ABI_VERSION = 1
MAX_WORKSPACES = 16
ERROR_SIZE = 512

K_INT, K_FLOAT, K_BOOL, K_STR = 0, 1, 2, 3
K_LIST_INT, K_LIST_FLOAT, K_LIST_BOOL, K_LIST_STR = 4, 5, 6, 7
K_LIST_LIST_INT, K_LIST_LIST_FLOAT = 8, 9


class AttrRecord(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("kind", ctypes.c_int32),
        ("count", ctypes.c_int32),
        ("ints", ctypes.POINTER(ctypes.c_int64)),
        ("floats", ctypes.POINTER(ctypes.c_double)),
        ("strs", ctypes.POINTER(ctypes.c_char_p)),
        ("row_lens", ctypes.POINTER(ctypes.c_int32)),
    ]


class ExtraData(ctypes.Structure):
    _fields_ = [
        ("abi_version", ctypes.c_uint32),
        ("nattrs", ctypes.c_int32),
        ("attrs", ctypes.POINTER(AttrRecord)),
        ("kernel_data", ctypes.c_void_p),
        ("kernel_data_deleter", ctypes.c_void_p),
        ("nworkspace", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
        ("workspace", ctypes.c_uint64 * MAX_WORKSPACES),
        ("error", ctypes.c_char * ERROR_SIZE),
    ]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _classify(name: str, value: Any) -> Tuple[int, List[Any], List[int]]:
    """(kind, flat values, row lengths) of one attribute value."""
    if isinstance(value, bool):
        return K_BOOL, [value], []
    if _is_int(value):
        return K_INT, [value], []
    if isinstance(value, float):
        return K_FLOAT, [value], []
    if isinstance(value, str):
        return K_STR, [value], []
    if isinstance(value, (list, tuple)):
        items = list(value)
        if all(isinstance(v, bool) for v in items) and items:
            return K_LIST_BOOL, items, []
        if all(_is_int(v) for v in items):
            return K_LIST_INT, items, []
        if all(_is_number(v) for v in items):
            return K_LIST_FLOAT, items, []
        if all(isinstance(v, str) for v in items):
            return K_LIST_STR, items, []
        if all(isinstance(v, (list, tuple)) and all(_is_number(x) for x in v) for v in items):
            flat = [x for v in items for x in v]
            kind = K_LIST_LIST_INT if all(_is_int(x) for x in flat) else K_LIST_LIST_FLOAT
            return kind, flat, [len(v) for v in items]
    raise TypeError(f"attribute '{name}' has a value aot kernels cannot read: {value!r}; use an int, float, "
                    f"bool, str, a list of one of those, or a list of lists of numbers")


class ExtraBlock:
    """The ``extra`` memory of one op; ``address`` is what the kernel receives."""

    def __init__(self, attrs: Dict[str, Any]) -> None:
        self._keep: List[Any] = []
        records = (AttrRecord * max(1, len(attrs)))()
        for i, (name, value) in enumerate(attrs.items()):
            kind, flat, rows = _classify(name, value)
            r = records[i]
            r.name = self._bytes(name)
            r.kind = kind
            r.count = len(rows) if rows else (len(flat) if kind >= K_LIST_INT else 1)
            if kind == K_STR or kind == K_LIST_STR:
                arr = (ctypes.c_char_p * max(1, len(flat)))(*[self._bytes(s) for s in flat])
                r.strs = arr
            elif kind in (K_FLOAT, K_LIST_FLOAT, K_LIST_LIST_FLOAT):
                arr = (ctypes.c_double * max(1, len(flat)))(*[float(v) for v in flat])
                r.floats = arr
            else:
                arr = (ctypes.c_int64 * max(1, len(flat)))(*[int(v) for v in flat])
                r.ints = arr
            self._keep.append(arr)
            if rows:
                lens = (ctypes.c_int32 * len(rows))(*rows)
                r.row_lens = lens
                self._keep.append(lens)
        self._records = records
        self.data = ExtraData()
        self.data.abi_version = ABI_VERSION
        self.data.nattrs = len(attrs)
        self.data.attrs = records
        self.address: int = ctypes.addressof(self.data)

    def _bytes(self, s: str) -> bytes:
        b = s.encode()
        self._keep.append(b)
        return b

    def take_error(self) -> str:
        """The error Init recorded ("" if none), cleared so the next Init (after a failed one) starts clean."""
        msg = self.data.error.decode(errors="replace")
        self.data.error = b""
        return msg

    def workspace_sizes(self) -> List[int]:
        """Bytes of each scratch buffer an Init asked for with ``SetWorkSpace``."""
        return [int(self.data.workspace[i]) for i in range(self.data.nworkspace)]
