"""Output specs of ``ops.Custom``: the record type and the one rule both custom.py and its hybrid
path (custom_hybrid.py) apply to ``out_shape``/``out_dtype``, kept below both so neither imports the other
back."""
from __future__ import annotations

from typing import Any, Tuple

import numpy as np

__all__ = ["Spec", "is_spec_fn"]

Spec = Tuple[Tuple[int, ...], np.dtype]  # (shape, numpy dtype) of one output


def is_spec_fn(spec: Any) -> bool:
    """A callable out_shape/out_dtype (a dtype class such as ``np.float32`` is a dtype, not a function)."""
    return callable(spec) and not isinstance(spec, type)
