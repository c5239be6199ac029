"""Timing shared by the benchmark scripts: cases timed round-robin, the best round counts.

Interleaving the cases means that load from other processes on a shared
machine hurts every contender alike; taking each case's best round (the mean
of that round's calls) keeps the figure closest to the work itself.
"""
from __future__ import annotations

import timeit
from typing import Callable, Dict

__all__ = ["best_of"]


def best_of(cases: Dict[str, Callable[[], object]], number: int, rounds: int) -> Dict[str, float]:
    """Seconds per call of each case: the best of ``rounds`` rounds of ``number`` calls, round-robin
    (each case called once first, untimed, to warm it)."""
    for fn in cases.values():
        fn()
    best = {name: float("inf") for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            best[name] = min(best[name], timeit.timeit(fn, number=number) / number)
    return best
