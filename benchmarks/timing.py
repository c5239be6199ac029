"""The benchmark harness shared by the scripts in benchmarks/: pinned threads, interleaved rounds, spreads,
goal lines and an exit status that says when a row could not be measured.

Import it before numpy or torch (``import timing`` first): importing it sets the thread variables of
every BLAS/OpenMP runtime to ``--threads N`` (default 1), so every side of a comparison runs on the
same number of threads; ``load_torch()`` then sets torch's own count. Cases are timed in interleaved
rounds (A B A B ..., the order rotated each round), so load from other processes falls on every case
alike; each case reports the median of its rounds with the min-max, never only the best round. A ratio
of two cases is taken round by round (the two were timed back to back) and reported the same way.
"""
from __future__ import annotations

import datetime
import gc
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

__all__ = ["HERE", "ROOT", "THREADS", "Stat", "Report", "Unmeasured", "interleaved", "ratio", "load_torch",
           "child_env", "run_child", "header", "table"]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
               "NUMEXPR_NUM_THREADS")


def _threads_from_argv(argv: Sequence[str]) -> int:
    """``--threads N`` / ``--threads=N`` from the command line (before argparse runs); else the parent
    benchmark's count (a child inherits BENCH_THREADS), else 1."""
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            return int(argv[i + 1])
        if a.startswith("--threads="):
            return int(a.split("=", 1)[1])
    return int(os.environ.get("BENCH_THREADS", "1"))


THREADS = _threads_from_argv(sys.argv)
if ("numpy" in sys.modules or "torch" in sys.modules) and any(os.environ.get(v) != str(THREADS)
                                                             for v in THREAD_VARS):
    # their thread pools were sized already, from other settings (a child of a benchmark inherits them)
    raise RuntimeError("benchmarks/timing.py must be imported before numpy and torch (it pins their threads)")
for _var in THREAD_VARS + ("BENCH_THREADS",):
    os.environ[_var] = str(THREADS)  # read once, when each runtime loads; children inherit them
for _p in (str(ROOT), str(HERE)):  # run from a checkout without installing; `import timing` works anywhere
    if _p not in sys.path:
        sys.path.insert(0, _p)

_limits = None  # threadpoolctl's limiter, kept alive for the process
_torch_missing = False  # load_torch() found no torch


def _limit_pools() -> str:
    """Caps the BLAS/OpenMP pools already loaded (threadpoolctl, when installed); says what it did."""
    global _limits
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return "threadpoolctl not installed (thread variables only)"
    _limits = threadpool_limits(THREADS)
    return "threadpoolctl limits set"


@dataclass
class Stat:
    """Seconds per call of one case, one sample per round."""

    samples: List[float]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def lo(self) -> float:
        return min(self.samples)

    @property
    def hi(self) -> float:
        return max(self.samples)

    def fmt(self, unit: str = "us", digits: int = 2) -> str:
        """``12.30 us (11.90-13.05)``: the median, then min-max, in ``unit`` (s, ms, us, ns, auto; x for ratios)."""
        if unit == "auto":  # the unit that keeps the median between 1 and 1000
            unit = next((u for u, lim in (("us", 1e-3), ("ms", 1.0)) if self.median < lim), "s")
        scale = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9, "x": 1.0}[unit]
        m, lo, hi = self.median * scale, self.lo * scale, self.hi * scale
        sep = "" if unit == "x" else " "
        return f"{m:.{digits}f}{sep}{unit} ({lo:.{digits}f}-{hi:.{digits}f})"


def interleaved(cases: Dict[str, Callable[[], object]], number: int, rounds: int, warmup: int = 1,
                sync: Optional[Callable[[], object]] = None) -> Dict[str, Stat]:
    """Seconds per call of each case: ``rounds`` rounds, each timing ``number`` calls of every case back to
    back (the order rotated by one each round), after ``warmup`` untimed calls of each. ``sync`` (a device
    synchronize) runs before and after each timed block, inside it at the end."""
    names = list(cases)
    for name in names:
        for _ in range(warmup):
            cases[name]()
    samples: Dict[str, List[float]] = {name: [] for name in names}
    gc_was_on = gc.isenabled()
    gc.disable()  # as timeit does: a collection lands on whichever case happens to run then
    try:
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                samples[name].append(_block(cases[name], number, sync) / number)
    finally:
        if gc_was_on:
            gc.enable()
    return {name: Stat(s) for name, s in samples.items()}


def _block(fn: Callable[[], object], number: int, sync: Optional[Callable[[], object]]) -> float:
    """Seconds for ``number`` calls of ``fn`` (a device synchronized before and, inside the time, after)."""
    if sync is not None:
        sync()
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    if sync is not None:
        sync()
    return time.perf_counter() - t0


def ratio(a: Stat, b: Stat) -> Stat:
    """``a / b`` round by round (interleaved rounds are paired): its median and min-max."""
    return Stat([x / y for x, y in zip(a.samples, b.samples)])


class Unmeasured(Exception):
    """A row that could not be measured: a child process failed, a file is missing."""


def child_env(**extra: str) -> Dict[str, str]:
    """The environment for a benchmark's child process: this one's (pinned threads included), with the
    checkout and benchmarks/ on PYTHONPATH so the child imports this runtime and this harness."""
    env = dict(os.environ)
    path = [str(ROOT), str(HERE)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(path)
    env.update(extra)
    return env


def run_child(args: Sequence[str], env: Optional[Dict[str, str]] = None, timeout: float = 1800,
              what: str = "child process") -> subprocess.CompletedProcess:
    """Runs a child to completion; a non-zero exit raises Unmeasured with the end of its stderr."""
    try:
        res = subprocess.run(list(args), capture_output=True, text=True, env=env or child_env(), timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Unmeasured(f"{what} timed out after {timeout:.0f} s") from None
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise Unmeasured(f"{what} exited {res.returncode}: {tail[0]}")
    return res


def load_torch():
    """torch pinned to THREADS threads, or None after one line saying its columns are skipped."""
    global _torch_missing
    try:
        import torch
    except ImportError:
        _torch_missing = True
        print("torch not installed: the torch columns and goals are skipped")
        return None
    torch.set_num_threads(THREADS)
    try:
        torch.set_num_interop_threads(THREADS)
    except RuntimeError:  # only settable before torch's first parallel work
        pass
    return torch


def header(title: str, rounds: Optional[int], torch=None) -> None:
    """One block naming the conditions: versions, threads, cores, load, date (UTC)."""
    import numpy as np
    pools = _limit_pools()
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if torch is not None:
        tv = torch.__version__
    else:
        import importlib.util
        missing = _torch_missing or importlib.util.find_spec("torch") is None
        tv = "not installed" if missing else "not used here"
    print(f"{title}\npython {platform.python_version()}, numpy {np.__version__}, torch {tv}; {THREADS} thread(s) "
          f"on every side ({pools}); {os.cpu_count()} cpus, load average {load}; {now}\n"
          + (f"each figure: median of {rounds} interleaved rounds (min-max)" if rounds else
             "figures: single samples unless a min-max is shown"))


def table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A markdown table."""
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        print("| " + " | ".join(row) + " |")


class Report:
    """Goal lines (MET / MISSED) and rows that could not be measured (FAIL: exit status 1)."""

    def __init__(self) -> None:
        self.met = 0
        self.missed = 0
        self.failed: List[str] = []

    def goal(self, text: str, ok: bool, figure: str = "") -> bool:
        """Prints ``goal: <text>: <figure>: MET|MISSED``; returns ``ok``."""
        self.met += ok
        self.missed += not ok
        print(f"goal: {text}{': ' + figure if figure else ''}: {'MET' if ok else 'MISSED'}")
        return ok

    def fail(self, row: str, why: object) -> None:
        """A row that could not be measured: printed as FAIL, and the exit status becomes 1."""
        self.failed.append(row)
        print(f"FAIL: {row}: not measured: {why}")

    def finish(self) -> int:
        """The summary line; 1 when a row could not be measured, else 0 (a MISSED goal is a result)."""
        print(f"\n{self.met} goal(s) MET, {self.missed} MISSED, {len(self.failed)} row(s) not measured"
              + (f" ({', '.join(self.failed)})" if self.failed else ""))
        return 1 if self.failed else 0
