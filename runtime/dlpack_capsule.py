"""The DLTensor dtype field of a DLPack capsule, read and written in place through ctypes.

A capsule named "dltensor" holds a DLManagedTensor (DLPack 0.x: the DLTensor comes first); one
named "dltensor_versioned" holds a DLManagedTensorVersioned (DLPack 1.x: version, manager_ctx,
deleter and flags come before the DLTensor). dlpack.h gives both layouts; the structures below
repeat them up to the field read here, so ctypes works out the offsets for this machine.
runtime/dlpack_host.py reads the field to name a dtype numpy refused; runtime/dlpack_export.py
writes it to export bfloat16. Imported only by them, so ``import runtime`` loads no ctypes.
"""
from __future__ import annotations

import ctypes
from typing import Any, Optional

__all__ = ["DLDataType", "dtype_field"]


class DLDataType(ctypes.Structure):
    """dlpack.h's DLDataType: a type code (kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4 ...), bits, lanes."""
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLTensorHead(ctypes.Structure):
    """DLTensor up to its dtype (shape, strides and byte_offset follow)."""
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType)]


class _VersionedHead(ctypes.Structure):
    """DLManagedTensorVersioned up to its DLTensor's dtype."""
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensorHead)]


_DTYPE_AT = {b"dltensor": _DLTensorHead.dtype.offset,
             b"dltensor_versioned": _VersionedHead.dl_tensor.offset + _DLTensorHead.dtype.offset}
# own prototypes: setting restype on ctypes.pythonapi's functions would change them for everyone
_get_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", ctypes.pythonapi))
_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))


def dtype_field(capsule: Any) -> Optional[DLDataType]:
    """The DLDataType inside an unconsumed DLPack capsule, as a view that writes through to it.

    None for a capsule of another name (one a consumer already took is "used_dltensor...")."""
    name = _get_name(capsule)
    at = _DTYPE_AT.get(name)
    if at is None:
        return None
    return DLDataType.from_address(_get_pointer(capsule, name) + at)
