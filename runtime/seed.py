"""``set_seed``: one random generator for initializers and dropout, so a run can be repeated.

The generator is numpy's ``default_rng``; before any ``set_seed`` it is seeded
from the operating system, as MindSpore's is when no seed is set.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

__all__ = ["set_seed", "get_seed", "generator"]

_seed: Optional[int] = None
_rng: np.random.Generator = np.random.default_rng()


def set_seed(seed: int) -> None:
    """Reseed the generator behind initializers and ``nn.Dropout``."""
    global _seed, _rng
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"set_seed: seed must be an int, got {type(seed).__name__}")
    if seed < 0:
        raise ValueError(f"set_seed: seed must be non-negative, got {seed}")
    _seed = int(seed)
    _rng = np.random.default_rng(_seed)


def get_seed() -> Optional[int]:
    """The last seed given to ``set_seed`` (None if never called)."""
    return _seed


def generator() -> np.random.Generator:
    """The generator to draw from (read it at each use: ``set_seed`` replaces it)."""
    return _rng
