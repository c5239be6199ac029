"""``runtime.from_dlpack``: a Tensor over another library's memory, without copying.

Any object with ``__dlpack__`` and ``__dlpack_device__`` (numpy, PyTorch,
CuPy, JAX arrays, and ``runtime.Tensor`` itself) is taken: host memory
through ``numpy.from_dlpack`` (bfloat16 through torch's or JAX's own numpy
view: runtime/dlpack_host.py), CUDA memory through ``cupy.from_dlpack``, a
runtime Tensor's as its array. The result shares memory with ``obj``;
``Tensor.__dlpack__`` is the way back (bfloat16 too: runtime/dlpack_export.py).
``dlpack_input`` is what a C++ operator's tensor argument does with such an
object (include/opbuilder/detail/runtime_bridge.h calls it).
"""
from __future__ import annotations

import sys
from typing import Any

import numpy as np

from . import dtypes as _dt
from .dlpack_host import RefusedWrite, TorchVersion, host_array, torch_array, torch_write_refusal
from .tensor import Tensor
from .versions import owner_counter, share_version

__all__ = ["from_dlpack", "dlpack_input"]

_KDL_CPU, _KDL_CUDA, _KDL_CUDA_HOST, _KDL_CUDA_MANAGED = 1, 2, 3, 13
_NAMES = {4: "OpenCL", 7: "Vulkan", 8: "Metal", 9: "VPI", 10: "ROCm", 11: "ROCm host", 14: "oneAPI"}


def from_dlpack(obj: Any) -> Tensor:
    """A Tensor sharing ``obj``'s memory (on the CPU or a CUDA device), found through DLPack."""
    if not hasattr(obj, "__dlpack__") or not hasattr(obj, "__dlpack_device__"):
        raise TypeError(f"from_dlpack needs an object with __dlpack__ and __dlpack_device__ (a numpy, torch, "
                        f"CuPy or JAX array), got {type(obj).__name__}")
    kind, index = obj.__dlpack_device__()
    if isinstance(obj, Tensor):  # its own array: no capsule (numpy cannot read a bf16 one)
        arr = obj._data
    elif kind in (_KDL_CPU, _KDL_CUDA_HOST):
        arr = host_array(obj)
    elif kind in (_KDL_CUDA, _KDL_CUDA_MANAGED):
        from .cuda import _cupy
        arr = _cupy().from_dlpack(obj)
    else:
        raise ValueError(f"from_dlpack: {type(obj).__name__} lives on a {_NAMES.get(int(kind), f'type {kind}')} "
                         f"device ({index}); this runtime has CPU and CUDA tensors")
    try:
        _dt.from_numpy_dtype(arr.dtype)
    except TypeError as e:
        raise TypeError(f"from_dlpack: {e}") from None
    t = Tensor._from_array(arr)
    if isinstance(obj, Tensor):  # one memory: one version counter
        share_version(t, obj)
    elif isinstance(obj, np.ndarray):  # as from_numpy: one counter for the tensors over one array's memory
        t._vc = owner_counter(obj, t._vc)
    else:
        _share_torch_version(t, obj)
    return t


def _share_torch_version(t: Tensor, obj: Any) -> None:
    """``t`` is over the memory of ``obj``: a torch tensor's version counter becomes ``t``'s (a runtime write
    bumps torch's, so torch's autograd refuses a saved tensor it changed); an inference tensor, which torch
    lets nothing write outside InferenceMode, gives a read-only ``t`` (a write takes a private copy)."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(obj, torch.Tensor) or not isinstance(t._data, np.ndarray):
        return
    if obj.is_inference():  # no version counter, and no write outside InferenceMode, whenever the write comes
        t._data.flags.writeable = False
        return
    t._vc = TorchVersion(obj)


def dlpack_input(obj: Any) -> Tensor:
    """A C++ operator's argument from another framework (an object with ``__dlpack__``), as a Tensor
    sharing its memory and needing no grad.

    A torch tensor that requires grad is detached first (torch exports no such tensor; a C++ op
    called directly records into the runtime's graph, which cannot reach torch's:
    ``opbuilder.to_torch`` is the differentiable way). One torch would not let the op write now
    (``torch_write_refusal``: a conjugate or negative view, which DLPack cannot describe, an inference
    tensor outside InferenceMode, one that requires grad while grad mode is on) arrives as a private
    read-only copy with its values, whose write the operator refuses in torch's words (``RefusedWrite``).
    A CUDA tensor needs a usable GPU here.
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor) and torch_write_refusal(obj, "", 0) is not None:
        t = from_dlpack(obj.detach().resolve_conj().resolve_neg().clone())
        t._data.flags.writeable = False  # a write is refused (FinishDirty asks about read-only memory)
        t._vc = RefusedWrite(obj)
        return t
    if getattr(obj, "requires_grad", False) is True and hasattr(obj, "detach"):
        obj = obj.detach()
    if torch is not None and isinstance(obj, torch.Tensor) and getattr(obj, "is_cpu", False):  # subclasses too
        try:  # a view like DLPack's, at a tenth of the cost of torch's Python __dlpack__
            arr = torch_array(obj)
        except (TypeError, RuntimeError):  # a conjugate view, float8: DLPack says what it can do
            pass
        else:
            _dt.from_numpy_dtype(arr.dtype)
            t = Tensor._from_array(arr)
            t._vc = TorchVersion(obj)  # an op's write reaches torch's version counter
            return t
    device = getattr(obj, "__dlpack_device__", None)
    if device is not None:
        kind, index = device()
        if kind in (_KDL_CUDA, _KDL_CUDA_MANAGED):
            from .cuda import unavailable_reason
            why = unavailable_reason()
            if why is not None:
                raise ValueError(f"opbuilder: an argument is a {type(obj).__name__} on CUDA device {index}, and "
                                 f"this process has no usable GPU ({why}); pass a CPU tensor")
    return from_dlpack(obj)
