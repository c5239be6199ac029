"""``load_many``: build and load many operators at once (generated kernels, evaluation harnesses).

Each distinct item is built by one thread: a build spends its time waiting for
ninja and the compilers (child processes, the GIL released), so ``jobs``
threads keep ``jobs`` builds running. Threads are added only while the ones
running are compiling (``_run``): cached items load fastest on one. The pipeline under each is ``load()``'s
own: the cache's per-operator flock makes an item that another thread or
process is building compile once (the waiter finds it built), and imports are
serialised by the builder's lock. Equal items (the same ``Inline`` arguments,
or builders of the same spec) are one build and share one result.

``timeout`` is each item's limit for its compiles (compile/ninja_run.py,
``time_limit``): past it, ninja and every process of its build are killed and
the item's error is a ``BuildTimeout``. Waiting for a lock another process
holds is bounded by ``OPBUILDER_LOCK_TIMEOUT``, as for ``load()``.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Dict, Iterable, List, NamedTuple, Optional, Set, Union

from . import CustomOpBuilder
from .errors import BuildError
from .inline import Inline, load_written

__all__ = ["load_many", "LoadResult"]

Item = Union[Inline, CustomOpBuilder]


class LoadResult(NamedTuple):
    """What ``load_many`` made of one item: its ``module`` (None if it failed), its ``error`` (a
    ``BuildError``, ``BuildTimeout`` for a build past its time; None when it loaded) and the
    ``seconds`` its build and import took (for a repeated item, the first one's)."""

    module: Optional[ModuleType]
    error: Optional[BuildError]
    seconds: float


def _identity(item: Item) -> object:
    """Equal for items that are one build."""
    return item if isinstance(item, Inline) else ("builder", item.spec)


def _dependencies_first(builder: CustomOpBuilder) -> Optional[ModuleType]:
    """For an item with a time limit: its module when its warm record serves it (nothing to build); else
    None, once nanobind's runtime and the core library it loads are built if they must be, untimed. They
    are built once for all items (about a minute of CPU on a cold cache without opbuilder's installed
    runtime), not by any one item, so no item's limit may count them."""
    from .cache.shipped_record import find_record, no_build

    if find_record(builder.spec.sources) is None and not no_build():
        from .warm import module
        mod = module(builder.spec)
        if mod is not None:
            return mod
    try:
        builder.runtime_library()
        builder.core_library()
    except (BuildError, OSError):  # the item's own load says why, within its time
        pass
    return None


def _load_one(item: Item, timeout: Optional[float], stop: Optional[threading.Event] = None) -> LoadResult:
    """One item's result; ``stop``: set when load_many is interrupted (its builds start no compiler)."""
    from .compile.build_limits import stopping, time_limit

    t0 = time.perf_counter()
    try:
        builder = item.builder() if isinstance(item, Inline) else item
        with stopping(stop):
            module = _dependencies_first(builder) if timeout is not None else None
        if module is None:
            with time_limit(timeout, quiet=True), stopping(stop):
                try:
                    module = load_written(item.builder, builder) if isinstance(item, Inline) else builder.load()
                except BuildError as e:
                    _ = e.diagnostics  # worked out here, in parallel and within the item's time (else when read)
                    raise
    except BuildError as e:
        return LoadResult(None, _naming(e, item.name), time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001 -- one item's failure is its result, never the others'
        name = getattr(item, "name", "?")
        err = BuildError(f"building operator '{name}' failed: {type(e).__name__}: {e}", name=name)
        err.__cause__ = e
        return LoadResult(None, err, time.perf_counter() - t0)
    return LoadResult(module, None, time.perf_counter() - t0)


def _naming(err: BuildError, name: str) -> BuildError:
    """``err``, its message and ``name`` naming the item: an error raised before the build knew its
    operator (no nvcc on PATH for a CUDA item) says whose build it stopped, as every other item's does."""
    if not err.name:
        err.name = name
    if f"'{name}'" not in str(err):
        err.args = (f"building operator '{name}' failed: {err}",)
    return err


def load_many(items: Iterable[Item], jobs: Optional[int] = None, timeout: Optional[float] = None
              ) -> List[LoadResult]:
    """Build (if needed) and load every item, up to ``jobs`` builds at once; one ``LoadResult`` per
    item, in order.

    ``items``: ``opbuilder.Inline`` descriptions and ``CustomOpBuilder`` objects. ``jobs``: how many
    builds run at once (default: the cores this process may use). ``timeout``: seconds each item's
    build may take; past it its compilers are killed and its error is a ``BuildTimeout`` (None: no
    limit). A failing item never stops the others; a repeated or already cached item compiles
    once (across processes too: the cache's locks). Prints no progress lines; each result has its
    time."""
    if isinstance(items, (Inline, CustomOpBuilder, str, bytes)) or not hasattr(items, "__iter__"):
        raise TypeError(f"load_many: items must be a list of opbuilder.Inline or opbuilder.CustomOpBuilder "
                        f"items, got {type(items).__name__}" + (" (put the one item in a list)" if isinstance(
                            items, (Inline, CustomOpBuilder)) else ""))
    items = list(items)
    for i, item in enumerate(items):
        if not isinstance(item, (Inline, CustomOpBuilder)):
            raise TypeError(f"load_many: item {i} is a {type(item).__name__}; expected opbuilder.Inline or "
                            f"opbuilder.CustomOpBuilder")
    if jobs is None:
        jobs = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    elif isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"load_many: jobs must be a positive integer (or None for the cores), got {jobs!r}")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not timeout > 0):
        raise ValueError(f"load_many: timeout must be a positive number of seconds (or None), got {timeout!r}")
    if timeout is not None and timeout >= threading.TIMEOUT_MAX:  # inf: no limit (a watchdog timer cannot wait it)
        timeout = None
    first: Dict[object, int] = {}  # identity -> index of the distinct item that builds it
    for i, item in enumerate(items):
        first.setdefault(_identity(item), i)
    distinct = sorted(set(first.values()))
    from .warm import batch
    with batch():  # cached items: each file their warm records name is stat'ed once for all of them
        done = _run(items, distinct, jobs, timeout)
    return [done[first[_identity(item)]] for item in items]


_STOP_WAIT_S = 10.0  # after an interrupt, how long the workers may take to see their builds killed


def _stop_builds() -> int:
    """Kill every build this process runs (its ninja children, and their compilers): how many.

    An interrupt reaches the calling thread only; the workers' ninja would go on, and outlive this
    process (a runaway compile, forever). Each ninja is a child of ours with its build directory in
    its environment (compile/ninja_run.py); its compilers are found as a timeout finds them."""
    from .compile.ninja_run import ENV_MARK, _kill_build_processes

    me, mark = os.getpid(), f"{ENV_MARK}=".encode()
    dirs: Set[str] = set()
    killed: Set[int] = set()
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return 0
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                if int(f.read().rsplit(b")", 1)[1].split()[1]) != me:
                    continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        for var in env:
            if var.startswith(mark):
                dirs.add(var[len(mark):].decode(errors="surrogateescape"))
                try:
                    os.kill(int(entry), signal.SIGKILL)
                    killed.add(int(entry))
                except OSError:
                    pass
    session = os.getsid(0)
    for d in dirs:
        _kill_build_processes(Path(d), session, killed, 0.01)
    return len(killed)


_SPAWN_AFTER_S = 0.1  # a worker busy with one item this long is building it: start another, up to jobs


def _run(items: List[Item], distinct: List[int], jobs: int, timeout: Optional[float]) -> Dict[int, LoadResult]:
    """``_load_one`` of each of ``items[distinct]``, on at most ``jobs`` threads.

    One worker starts; another starts only while every worker has spent ``_SPAWN_AFTER_S`` on its
    current item (it is compiling). Cached items (about a millisecond each) thus load on one thread:
    two threads loading them at once contend for the GIL at each file-system call, and took 1.5-3x as
    long (40 cached items: ~36 ms on one thread, 55-120 ms on two, 2 busy cores). The calling thread
    only watches, waiting on a condition (it holds no GIL while it waits)."""
    done: Dict[int, LoadResult] = {}
    todo = list(reversed(distinct))  # popped from the end: in order
    cond = threading.Condition()
    busy: Dict[int, float] = {}  # worker number -> when it took its current item
    crashed: List[BaseException] = []  # what _load_one does not turn into a result (an interrupt)
    stop = threading.Event()  # set on an interrupt: the workers' builds (and their dependencies') start nothing

    def work(me: int) -> None:
        while True:
            with cond:
                busy.pop(me, None)
                if not todo or crashed:
                    cond.notify_all()
                    return
                i = todo.pop()
                busy[me] = time.monotonic()
            try:
                done[i] = _load_one(items[i], timeout, stop)
            except BaseException as e:  # raised in the caller's thread below
                with cond:
                    crashed.append(e)
                    busy.pop(me, None)
                    cond.notify_all()
                return

    workers: List[threading.Thread] = []

    def spawn() -> None:
        w = threading.Thread(target=work, args=(len(workers),), name=f"opbuilder-many-{len(workers)}", daemon=True)
        workers.append(w)
        w.start()

    spawn()
    try:
        with cond:
            while any(w.is_alive() for w in workers):
                now = time.monotonic()
                if (todo and not crashed and len(workers) < jobs
                        and all(now - t >= _SPAWN_AFTER_S for t in busy.values())):
                    spawn()
                cond.wait(_SPAWN_AFTER_S / 2)
    except BaseException as e:  # interrupted (KeyboardInterrupt comes to this thread): no build goes on
        with cond:
            crashed.append(e)  # no worker takes another item
        stop.set()  # no build of a worker starts a compiler from now on, nor waits for a lock any longer
        # each sweep kills what was started before the stop; a worker blocked in another process's lock
        # (not ours to kill) sees the stop within a poll, and holds the interrupt back no longer than this
        until = time.monotonic() + _STOP_WAIT_S
        while True:
            _stop_builds()
            alive = [w for w in workers if w.is_alive()]
            if not alive or time.monotonic() >= until:
                break
            alive[0].join(0.05)
        raise
    for w in workers:
        w.join()
    if crashed:
        raise crashed[0]
    return done
