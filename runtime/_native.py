"""What native code reads from the runtime: the one Python owner of the C++ <-> Python contract.

The C++ headers (include/opbuilder/detail/runtime_bridge.h, tensor.h, cuda.h) import this module
alone and look up the names in ``__all__`` on it; on ``runtime.Tensor`` objects they read and write
the attributes in ``TENSOR_ATTRS``, and on ``_state`` the ones in ``GRAD_STATE_ATTRS``, by name.
tests/test_native_contract.py parses the headers and checks that every module, name and attribute
they use is declared here and exists, so renaming one on the Python side fails a test instead of
every built operator at run time. A new name native code needs goes here first.
"""
from __future__ import annotations

import ctypes
from typing import Any, Tuple

from .autograd.grad_mode import _state, hooks_flag_address  # the per-thread grad mode: C++ reads and sets `_state.enabled`
from .jit.tracing import bound_hook, cpp_hook, flag_address  # Function<T>::Apply, m.def under a jit trace
from .dtypes import bfloat16  # a DType: its `.np` imports ml_dtypes on first use (C++ BFloat16Descr)
from .tensor import Tensor

__all__ = ["Tensor", "_state", "flag_address", "hooks_flag_address", "cpp_hook", "bound_hook", "bfloat16", "dlpack_input", "allocate", "describe", "wrap",
           "current_stream_ptr", "bridge_slot_address", "share_version", "share_counter", "own_counter", "rebase_view",
           "refresh_view_arg", "returned_view",
           "torch_array", "foreign_write_refusal", "TENSOR_ATTRS",
           "GRAD_STATE_ATTRS", "DEVICE_NAMES"]

# runtime.Tensor attributes native code reads or sets (class-level defaults keep a fresh tensor cheap)
TENSOR_ATTRS: Tuple[str, ...] = ("_data", "requires_grad", "_node", "_out_index", "_version", "_base_ref")
# attributes of `_state` native code reads or sets
GRAD_STATE_ATTRS: Tuple[str, ...] = ("enabled", "saved_hooks")
# runtime.device_memory's functions, for GPU tensors only: imported on first use (__getattr__ below)
DEVICE_NAMES: Tuple[str, ...] = ("allocate", "describe", "wrap", "current_stream_ptr")

# A framework bridge's C table (include/opbuilder/detail/foreign_api.h), null until one is loaded:
# opbuilder's torch bridge stores its address here when it is imported; operators read it.
bridge_slot = ctypes.c_void_p(0)


def bridge_slot_address() -> int:
    """The address of ``bridge_slot`` (read by operators, written by a bridge)."""
    return ctypes.addressof(bridge_slot)


def __getattr__(name: str) -> Any:
    """A name native code needs only off the common path, imported on first use and kept as a plain
    attribute afterwards (PEP 562): the GPU memory functions (a CPU-only process never imports
    device_memory) and ``dlpack_input`` (runtime.interop, for another framework's tensor)."""
    if name == "dlpack_input":
        from .interop import dlpack_input as value
    elif name == "share_version":  # an argument returned unchanged: a view of it (call_rules.h ShareVersion)
        from .call_rules import share_alias as value
    elif name == "share_counter":  # one tensor an op returned twice: one counter (call_rules.h ShareCounter)
        from .versions import share_version as value
    elif name == "own_counter":  # a saved output's counter, held apart from it (src/core/autograd.cpp OwnCounter)
        from .versions import counter as value
    elif name == "rebase_view":  # MarkDirty on a view (include/opbuilder/detail/call_rules.h)
        from .call_rules import rebase_view as value
    elif name == "refresh_view_arg":  # a view argument read after its base was written (call_rules.h)
        from .call_rules import refresh_view_arg as value
    elif name == "returned_view":  # a module function's result over its argument's memory (runtime_bridge.cpp)
        from .call_rules import returned_view as value
    elif name == "foreign_write_refusal":  # a torch tensor an op may not write now (call_rules.h ForeignRefusal)
        from .dlpack_host import foreign_write_refusal as value
    elif name == "torch_array":  # torch's own numpy view of a torch tensor an op hands back (dlpack_exchange.h)
        from .dlpack_host import torch_array as value
    elif name in DEVICE_NAMES:
        from . import device_memory
        value = getattr(device_memory, name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value
