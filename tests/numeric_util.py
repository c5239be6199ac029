"""Numerical derivatives shared by the tests: what analytic gradients are checked against."""
from __future__ import annotations

from typing import Callable

import numpy as np


def central(f: Callable[[np.ndarray], float], x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """d f / d x by central differences in float64."""
    g = np.zeros_like(x, dtype=np.float64)
    for i in np.ndindex(x.shape):
        up, down = x.astype(np.float64), x.astype(np.float64)
        up[i] += eps
        down[i] -= eps
        g[i] = (f(up) - f(down)) / (2 * eps)
    return g
