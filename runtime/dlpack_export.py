"""``Tensor.__dlpack__`` for host dtypes numpy's own DLPack export refuses: bfloat16.

numpy exports bool, integers, floats and complex itself, and raises BufferError for ml_dtypes'
bfloat16. The same memory viewed as uint16 is exported by numpy instead, and the DLTensor's dtype
is rewritten to DLPack's bfloat16 (kDLBfloat, 16 bits, 1 lane) before the capsule is handed out.
So numpy keeps doing everything else: the capsule holds the view (and through it the tensor's
array) until the consumer's deleter runs; it makes versioned capsules with their read-only flag,
copies on ``copy=True``, and checks ``dl_device`` and ``stream``. Any other dtype numpy refuses has
no DLPack type a consumer could read: BufferError naming it.
"""
from __future__ import annotations

from typing import Any, Dict, Tuple

import numpy as np

from . import dtypes as _dt
from .dlpack_capsule import dtype_field

__all__ = ["export"]

# numpy scalar type -> (DLPack type code, a numpy dtype of the same width that numpy exports)
_EXPORTED_AS: Dict[type, Tuple[int, np.dtype]] = {_dt.bfloat16.np.type: (4, np.dtype(np.uint16))}


def export(arr: np.ndarray, **kwargs: Any) -> Any:
    """A DLPack capsule over ``arr`` (a dtype numpy cannot export), made by numpy with ``kwargs``
    (``__dlpack__``'s: stream, max_version, dl_device, copy)."""
    spec = _EXPORTED_AS.get(arr.dtype.type)
    if spec is None:
        raise BufferError(f"__dlpack__: a tensor of dtype {arr.dtype} cannot be exported: DLPack has no such type "
                          f"(the runtime exports bool, integers, floats, bfloat16 and complex)")
    code, storage = spec
    capsule = arr.view(storage).__dlpack__(**kwargs)
    field = dtype_field(capsule)
    if field is None:  # numpy gave something else than a fresh capsule: nothing to rewrite safely
        raise BufferError(f"__dlpack__: numpy returned an unknown DLPack capsule for a {arr.dtype} tensor")
    field.code, field.bits, field.lanes = code, 8 * storage.itemsize, 1
    return capsule
