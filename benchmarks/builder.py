"""Builder speed: opbuilder against PyTorch's cpp_extension.load, measured in the same run.

    python benchmarks/builder.py [--samples 3] [--warm-runs 9] [--no-torch] [--keep] [--warm-only]
    python benchmarks/builder.py --bindings [--rounds 3]

Run time: about 12 minutes with torch and the default 3 samples on a quiet 2-core machine (a torch build
takes ~35 s; 5 torch builds per sample), about 3 minutes with ``--no-torch``.

The operator is the demo's multiply (custom_src/function_ops.cpp) and, for
PyTorch, the same multiply as a torch::autograd::Function
(benchmarks/torch_mul_op.cpp), one source each, including one project header
(``bench_config.h``) so that the header-edit scenario exists. The one-file
incremental scenario needs several sources: it edits ``extra.cpp`` of a
second operator built from the same source plus ``extra.cpp``. Every measurement runs in a new
Python process and times only the ``load()`` call (the framework is imported
first); each framework builds into its own fresh temporary directories, so
nothing cached on this machine is used or touched.

Each row is timed interleaved (benchmarks/timing.py): opbuilder, torch, torch, opbuilder ... (the order
rotated each sample), ``--samples`` samples each, so load from other processes falls on both sides alike;
every figure is the median with the min-max, and a ratio is taken sample by sample (the two ran back to
back). Rows compare like with like:
  first build             an empty cache / build directory on both sides (opbuilder also builds
                          nanobind's shared runtime and probes the toolchain: a newcomer's first build)
  new operator, warm      a new operator (nothing built for it) with the shared state already warm on both
                          sides (opbuilder: toolchain probe, nanobind runtime, PCH if any; torch: its
                          extensions directory): every later cold build
  warm load()             a new process loading the built operator
  warm: whole process     import + load() as a whole new process
  one-file incremental    extra.cpp of the two-source operator edited, rebuilt
  header-edit rebuild     bench_config.h edited, rebuilt in a new process
``--warm-only`` builds once and measures only the warm rows (opbuilder alone),
and says whether the warm ``load()`` meets its goal of 2 ms (WARM_GOAL_S).
The CPU table gives the CPU time (user + system) of the loading process and the
processes it waited for during ``load()`` (compilers, ninja), on both sides alike -- steadier than wall
time on a shared machine. Work opbuilder leaves running in the background after ``load()`` returns (a
pybind11 operator's detached PCH compile) is not in that figure; it is printed on its own line.
Both sides compile with the same optimisation flags: torch adds no -O flag of
its own, so it gets opbuilder's (-O2 -ftree-vectorize
-fvect-cost-model=dynamic) through extra_cflags. What still differs:
opbuilder links a one-source pybind11 module with gcc's LTO (its choice, to use
every core for code generation; a nanobind module is built without) and precompiles its header; torch does neither.
Child processes run with bytecode caching on (as an installed package has),
after one unmeasured run that writes it. Goal lines (MET/MISSED) follow the tables.

The demo operator is bound with nanobind (OB_MODULE): its first build includes nanobind's
shared runtime, and there is no precompiled header.

``--bindings`` compares the binding layers, interleaved (A B C ... A B C ..., medians with
min-max over ``--rounds``), each a new process and a fresh cache: the README operator bound with
nanobind (its runtime already built / not yet built, i.e. a newcomer's first operator), the
same with -flto off, the binding source edited and loaded again, the same source bound with
pybind11 (no PCH yet, as a newcomer), and the floor: a bare pybind11 and a bare nanobind
one-function module compiled by the compiler directly (nanobind: its user TU only).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing  # noqa: E402  (first: pins the thread count before numpy and torch load)
from timing import Report, Stat, ratio  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEMO_SOURCE = ROOT / "custom_src" / "function_ops.cpp"
TORCH_SOURCE = Path(__file__).resolve().parent / "torch_mul_op.cpp"
HEADER_USE = '\n#include "bench_config.h"\nint bench_config_value() { return BENCH_CONFIG; }\n'

OB_CHILD = """
import json, resource, sys, time
import runtime
from opbuilder import CustomOpBuilder
def _cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime
name, srcs = sys.argv[1], sys.argv[2:]
binding = None
if srcs and srcs[0].startswith("--binding="):
    binding, srcs = srcs[0].split("=", 1)[1], srcs[1:]
c0 = _cpu()
t0 = time.perf_counter()
m = CustomOpBuilder(name, srcs, binding=binding).load()
t1 = time.perf_counter()
c1 = _cpu()
assert m.mul(runtime.Tensor(2.0), runtime.Tensor(3.0)).item() == 6.0
import os
while True:  # work load() left running (a detached PCH compile): counted apart, as torch has none
    try:
        os.wait()
    except ChildProcessError:
        break
print(json.dumps({"seconds": t1 - t0, "cpu": c1 - c0, "bg_cpu": _cpu() - c1}))
"""

TORCH_CHILD = """
import json, resource, sys, time
import torch
from torch.utils import cpp_extension
def _cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime
SAME_FLAGS = ["-O2", "-ftree-vectorize", "-fvect-cost-model=dynamic"]  # opbuilder's optimisation flags
name, build_dir, srcs = sys.argv[1], sys.argv[2], sys.argv[3:]
c0 = _cpu()
t0 = time.perf_counter()
m = cpp_extension.load(name, srcs, build_directory=build_dir, verbose=False, extra_cflags=SAME_FLAGS)
t1 = time.perf_counter()
c1 = _cpu()
assert m.mul(torch.tensor([2.0]), torch.tensor([3.0])).item() == 6.0
print(json.dumps({"seconds": t1 - t0, "cpu": c1 - c0}))
"""

def _env(**extra: str) -> Dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("OPBUILDER_VERBOSE", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    # as in an activated virtual environment: torch runs `ninja` from PATH in every load(), and
    # a version manager's shim found first (pyenv's costs ~80 ms) would be timed instead of ninja
    env["PATH"] = os.pathsep.join(p for p in (str(Path(sys.executable).parent), env.get("PATH", "")) if p)
    env.update(extra)
    return env


def _run(code: str, args: List[str], env: Dict[str, str]) -> Dict[str, float]:
    """Run one measuring child; its {"seconds": wall, "cpu": cpu of it and its waited-for children}."""
    res = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                         timeout=1800)
    if res.returncode != 0:
        raise SystemExit(f"benchmark step failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def _sources(work: Path, main_source: Path, stem: str) -> List[str]:
    """The sources in ``work``: the main one (the demo operator, using bench_config.h) and extra.cpp."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "bench_config.h").write_text("#define BENCH_CONFIG 1\n")
    (work / "extra.cpp").write_text("int bench_extra() { return 1; }\n")
    main = work / f"{stem}.cpp"
    main.write_text(main_source.read_text() + HEADER_USE)
    return [str(main), str(work / "extra.cpp")]


def _edit(path: Path, old: str, new: str) -> None:
    path.write_text(path.read_text().replace(old, new))


WARM_GOAL_S = 0.002  # a warm load() in a new process: checks, hashing of keys, import


# goals (median ratios opbuilder / torch, wall time): opbuilder should cost at most half of torch's, and a new
# operator (nanobind, its runtime built) at most 0.05 of torch's (issue 21)
BUILD_GOALS = {"first": 0.5, "new_op": 0.05, "incremental": 0.5, "header": 0.5}
# --bindings: (row, seconds, what) of issue 21's absolute goals, wall time on 2 cores
BINDING_GOALS = [("nb_new", 1.0, "new nanobind operator, runtime built"),
                 ("nb_first", 5.0, "first operator in a fresh cache"),
                 ("nb_edit", 1.0, "binding source edited, load() again")]


class Side:
    """One framework's fresh work directory: sources, a shared cache (or extensions directory) and how a
    new process loads an operator there."""

    def __init__(self, framework: str, work: Path) -> None:
        self.framework, self.work = framework, work
        self.main, self.extra = _sources(work / "src", DEMO_SOURCE if framework == "opbuilder" else TORCH_SOURCE,
                                         "ob_op" if framework == "opbuilder" else "torch_op")
        self.ops = {"bench_ops": [self.main], "bench_multi": [self.main, self.extra]}

    def new_op(self, name: str) -> str:
        """A new operator's name, its source a copy of the main one (a different key, nothing built)."""
        src = Path(self.main).with_name(f"{name}.cpp")
        src.write_text(Path(self.main).read_text() + f"\n// {name}\n")
        self.ops[name] = [str(src)]
        return name

    def _state(self, fresh: Optional[str]) -> Path:
        d = self.work / (fresh or "shared")
        d.mkdir(parents=True, exist_ok=True)
        return d

    def load(self, name: str, fresh: Optional[str] = None) -> Dict[str, float]:
        """``load()`` of ``name`` in a new process: in the shared state, or in a new empty one (``fresh``)."""
        state = self._state(fresh)
        if self.framework == "opbuilder":
            return _run(OB_CHILD, [name, *self.ops[name]], _env(OPBUILDER_CACHE_DIR=str(state / "cache")))
        build_dir = state / "build" / name  # torch keeps one build.ninja per directory
        build_dir.mkdir(parents=True, exist_ok=True)
        return _run(TORCH_CHILD, [name, str(build_dir), *self.ops[name]], _env(TORCH_EXTENSIONS_DIR=str(state / "ext")))

    def whole_process(self) -> Dict[str, float]:
        """Seconds of a whole new process: import + warm load() of bench_ops in the shared state."""
        import time
        state = self._state(None)
        if self.framework == "opbuilder":
            code = (f"import runtime; from opbuilder import CustomOpBuilder; "
                    f"CustomOpBuilder('bench_ops', {[self.main]!r}).load()")
            env = _env(OPBUILDER_CACHE_DIR=str(state / "cache"))
        else:
            code = (f"import torch; from torch.utils import cpp_extension; cpp_extension.load('bench_ops', "
                    f"{[self.main]!r}, build_directory={str(state / 'build' / 'bench_ops')!r}, "
                    f"extra_cflags=['-O2', '-ftree-vectorize', '-fvect-cost-model=dynamic'])")
            env = _env(TORCH_EXTENSIONS_DIR=str(state / "ext"))
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, env=env, timeout=600)
        return {"seconds": time.perf_counter() - t0}


def _interleaved(sides: List[Side], samples: int, step: Callable[[Side, int], Dict[str, float]],
                 what: str) -> Dict[str, List[Dict[str, float]]]:
    """``step(side, i)`` for every side, ``samples`` times, the order rotated each sample (A B, B A ...)."""
    out: Dict[str, List[Dict[str, float]]] = {s.framework: [] for s in sides}
    for i in range(samples):
        print(f"  {what}: sample {i + 1}/{samples} ...", file=sys.stderr, flush=True)
        for side in sides[i % len(sides):] + sides[:i % len(sides)]:
            out[side.framework].append(step(side, i))
    return out


def measure(sides: List[Side], samples: int, warm_runs: int, warm_only: bool = False
            ) -> Dict[str, Dict[str, List[Dict[str, float]]]]:
    """Every row, each side interleaved with the other: row -> framework -> one result per sample."""
    rows: Dict[str, Dict[str, List[Dict[str, float]]]] = {}
    if not warm_only:
        rows["first"] = _interleaved(sides, samples, lambda s, i: s.load("bench_ops", fresh=f"first-{i}"),
                                     "first build, empty state")
    for side in sides:  # unmeasured: the shared state's first build, and one load that writes bytecode
        print(f"  {side.framework}: building in the shared state (unmeasured) ...", file=sys.stderr, flush=True)
        side.load("bench_ops")
        if side.framework == "opbuilder" and _binding(side.main) == "pybind11":
            _wait_for_pch(side.work / "shared" / "cache")  # built in the background; let it finish
        side.load("bench_ops")
    rows["warm"] = _interleaved(sides, warm_runs, lambda s, i: s.load("bench_ops"), "warm load()")
    rows["warm_process"] = _interleaved(sides, max(3, warm_runs // 3), lambda s, i: s.whole_process(),
                                        "warm whole process")
    if warm_only:
        return rows
    rows["new_op"] = _interleaved(sides, samples, lambda s, i: s.load(s.new_op(f"bench_new{i}")),
                                  "new operator, warm shared state")
    for side in sides:
        side.load("bench_multi")  # unmeasured: the two-source operator's first build

    def incremental(side: Side, i: int) -> Dict[str, float]:
        _edit(Path(side.extra), f"return {i + 1};", f"return {i + 2};")
        return side.load("bench_multi")

    def header(side: Side, i: int) -> Dict[str, float]:
        _edit(Path(side.main).with_name("bench_config.h"), f"BENCH_CONFIG {i + 1}", f"BENCH_CONFIG {i + 2}")
        return side.load("bench_ops")
    rows["incremental"] = _interleaved(sides, samples, incremental, "one-file incremental")
    rows["header"] = _interleaved(sides, samples, header, "header edit")
    return rows


def _binding(source: str) -> str:
    from opbuilder.compile.binding import detect_binding
    return detect_binding("bench_ops", [Path(source)])


def _wait_for_pch(cache: Path, timeout: float = 600) -> None:
    import time
    deadline = time.monotonic() + timeout
    while not list(cache.glob(".pch/*/pch.h.gch")):
        if time.monotonic() > deadline:
            raise SystemExit(f"the precompiled header never appeared under {cache}/.pch (see its build.log)")
        time.sleep(0.1)


BARE_PYBIND11 = ("#include <pybind11/pybind11.h>\n"
                 "PYBIND11_MODULE(bare, m) { m.def(\"f\", [](int a) { return a + 1; }); }\n")
BARE_NANOBIND = ("#include <nanobind/nanobind.h>\n"
                 "NB_MODULE(bare, m) { m.def(\"f\", [](int a) { return a + 1; }); }\n")


def _bare_compile(work: Path, binding: str) -> Dict[str, float]:
    """The floor: one bare one-function module compiled and linked by the compiler directly, -O2
    (nanobind: the user TU only, against its shared runtime)."""
    import sysconfig
    import time
    src = work / f"bare_{binding}.cpp"
    src.write_text(BARE_PYBIND11 if binding == "pybind11" else BARE_NANOBIND)
    if binding == "pybind11":
        import pybind11
        inc = ["-isystem", pybind11.get_include()]
    else:
        import nanobind
        inc = ["-isystem", nanobind.include_dir(), "-DNB_SHARED"]
    cmd = [os.environ.get("CXX") or "c++", "-std=c++17", "-O2", "-fPIC", "-shared", "-fvisibility=hidden", *inc,
           "-isystem", sysconfig.get_paths()["include"], str(src), "-o", str(work / f"bare_{binding}.so")]
    r0 = os.times()
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    t1 = time.perf_counter()
    r1 = os.times()
    return {"seconds": t1 - t0, "cpu": (r1.children_user - r0.children_user) + (r1.children_system - r0.children_system)}


def bindings(work: Path, rounds: int) -> int:
    """The ``--bindings`` table (see the module docstring)."""
    base = work / "runtime-cache"
    src_dir = work / "src"
    src_dir.mkdir(parents=True)
    # a cache holding nanobind's runtime (and the probed toolchain), copied for each "runtime built" row
    seed = src_dir / "seed.cpp"
    seed.write_text(BARE_NANOBIND.replace("<nanobind/nanobind.h>", '"opbuilder/extension.h"')
                    .replace("NB_MODULE(bare, m)", "OB_MODULE(m)"))
    _run(OB_CHILD.replace("assert m.mul", "# "), ["seed_op", str(seed)], _env(OPBUILDER_CACHE_DIR=str(base)))
    if os.environ.get("OPBUILDER_PCH", "1") not in ("0", "", "off", "false", "no"):
        _wait_for_pch(base)  # the shared state a later operator finds: runtime, core library, PCH
    samples: Dict[str, List[Dict[str, float]]] = {}

    def fresh(tag: str, with_runtime: bool) -> Path:
        d = work / f"{tag}-{len(samples.get(tag, []))}"
        if with_runtime:
            shutil.copytree(base, d, symlinks=True)
        else:
            d.mkdir(mode=0o700)
        return d

    def op_source(tag: str, r: int) -> str:
        p = src_dir / f"{tag}_{r}.cpp"
        p.write_text(DEMO_SOURCE.read_text() + f"\n// {tag} round {r}\n")
        return str(p)

    def add(tag: str, res: Dict[str, float]) -> None:
        samples.setdefault(tag, []).append(res)

    for r in range(rounds):
        print(f"  round {r + 1}/{rounds} ...", file=sys.stderr, flush=True)
        add("nb_new", _run(OB_CHILD, ["bench_nb", op_source("nb_new", r)],
                           _env(OPBUILDER_CACHE_DIR=str(fresh("nb_new", True)))))
        add("bare_pybind11", _bare_compile(work, "pybind11"))
        add("nb_first", _run(OB_CHILD, ["bench_nb", op_source("nb_first", r)],
                             _env(OPBUILDER_CACHE_DIR=str(fresh("nb_first", False)))))
        cache = fresh("nb_nolto", True)
        src = op_source("nb_nolto", r)
        add("nb_nolto", _run(OB_CHILD, ["bench_nb", src], _env(OPBUILDER_CACHE_DIR=str(cache), OPBUILDER_LTO="0")))
        _edit(Path(src), f"// nb_nolto round {r}", f"// nb_nolto round {r}, edited")
        add("nb_edit", _run(OB_CHILD, ["bench_nb", src], _env(OPBUILDER_CACHE_DIR=str(cache))))
        add("pb_first", _run(OB_CHILD, ["bench_pb", "--binding=pybind11", op_source("pb_first", r)],
                             _env(OPBUILDER_CACHE_DIR=str(fresh("pb_first", False)), OPBUILDER_PCH="0")))
        add("bare_nanobind", _bare_compile(work, "nanobind"))

    def stat(tag: str, what: str) -> str:
        v = [x[what] for x in samples[tag]]
        return f"{statistics.median(v):6.2f} s ({min(v):.2f}-{max(v):.2f})"

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"binding benchmark: {_compiler()}; {cores} cores; {rounds} interleaved rounds; load average "
          f"{os.getloadavg()[0]:.2f} at the end")
    rows = [("nb_new", "nanobind README op, runtime built"), ("nb_first", "nanobind, first op (runtime too)"),
            ("nb_nolto", "nanobind, runtime built, -flto off"), ("nb_edit", "nanobind, binding source edited"),
            ("pb_first", "pybind11 README op, no PCH"), ("bare_pybind11", "bare pybind11 module (c++ only)"),
            ("bare_nanobind", "bare nanobind module (c++ only)")]
    print(f"{'':38s}{'wall, median (min-max)':>26s}{'CPU, median (min-max)':>26s}")
    for tag, label in rows:
        print(f"{label:38s}{stat(tag, 'seconds'):>26s}{stat(tag, 'cpu'):>26s}")
    nb = statistics.median(x["seconds"] for x in samples["nb_new"])
    pb = statistics.median(x["seconds"] for x in samples["bare_pybind11"])
    print(f"nanobind README op / bare pybind11 module: {nb / pb:.2f} (wall)")
    print()
    report = Report()

    def wall(tag: str) -> float:
        return statistics.median(x["seconds"] for x in samples[tag])

    for tag, limit, text in BINDING_GOALS:
        report.goal(f"{text} <= {limit:.1f} s wall (issue 21)", wall(tag) <= limit, f"{wall(tag):.2f} s")
    report.goal("new nanobind operator / bare pybind11 module <= 0.25 (issue 21)", nb / pb <= 0.25, f"{nb / pb:.2f}")
    return report.finish()


def _fmt(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e3:.2f} ms" if seconds < 0.1 else f"{seconds:.1f} s"


def _compiler() -> str:
    cxx = os.environ.get("CXX") or "c++"
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    except (OSError, IndexError):
        return cxx


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=3, help="interleaved samples of each build row (per side)")
    ap.add_argument("--warm-runs", type=int, default=9, help="new processes per warm load() row (per side)")
    ap.add_argument("--threads", type=int, default=1, help="BLAS/OpenMP threads of every side (timing.py)")
    ap.add_argument("--no-torch", action="store_true", help="skip PyTorch even if it is installed")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directories (printed)")
    ap.add_argument("--warm-only", action="store_true", help="only the warm rows, opbuilder only (one build)")
    ap.add_argument("--bindings", action="store_true", help="nanobind against pybind11, interleaved")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of --bindings")
    args = ap.parse_args(argv)
    if args.bindings:
        work = Path(tempfile.mkdtemp(prefix="opbuilder-bench-"))
        os.chmod(work, 0o700)
        try:
            return bindings(work, args.rounds)
        finally:
            shutil.rmtree(work, ignore_errors=True) if not args.keep else print(f"kept {work}", file=sys.stderr)

    import importlib.util
    use_torch = not (args.no_torch or args.warm_only) and importlib.util.find_spec("torch") is not None
    timing.header("builder: opbuilder against torch's cpp_extension.load", None,
                  timing.load_torch() if use_torch else None)
    print(f"each figure: median (min-max) of {args.samples} interleaved samples per side, warm rows of "
          f"{args.warm_runs} (whole process: {max(3, args.warm_runs // 3)}); ratios sample by sample")
    report = Report()
    work = Path(tempfile.mkdtemp(prefix="opbuilder-bench-"))
    os.chmod(work, 0o700)
    try:
        sides = [Side("opbuilder", work / "opbuilder")] + ([Side("torch", work / "torch")] if use_torch else [])
        rows = measure(sides, args.samples, args.warm_runs, args.warm_only)
    except SystemExit as e:  # a child failed: its stderr is in the message
        report.fail("every row", e)
        return report.finish()
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"{_compiler()}; {cores} cores; load average {os.getloadavg()[0]:.2f} at the end")
    labels = [("first", "first build (empty cache / build dir)"), ("new_op", "new operator, warm shared state"),
              ("warm", "warm load() in a new process"), ("warm_process", "warm: whole new process, import + load"),
              ("incremental", "one-file incremental rebuild"), ("header", "header-edit rebuild")]

    def stat(row: str, fw: str, what: str) -> Optional[Stat]:
        got = rows.get(row, {}).get(fw)
        return Stat([x[what] for x in got]) if got and what in got[0] else None

    for what, title in (("seconds", "wall time"), ("cpu", "CPU time of the load() (less noisy)")):
        table = []
        for row, label in labels:
            a, b = stat(row, "opbuilder", what), stat(row, "torch", what)
            if a is None:
                continue
            table.append([label, a.fmt("auto"), b.fmt("auto") if b else "-", ratio(a, b).fmt("x") if b else "-"])
        if table:
            print()
            timing.table([title, "opbuilder", "torch load", "opbuilder / torch"], table)
    bg = [x.get("bg_cpu", 0.0) for r in rows.values() for x in r.get("opbuilder", [])]
    print(f"\nopbuilder's background work after load() (not in the CPU table): "
          f"{max(bg) if bg else 0.0:.2f} s at most")
    print()
    warm = stat("warm", "opbuilder", "seconds")
    report.goal(f"warm load() in a new process <= {_fmt(WARM_GOAL_S)} (docs/builder.md)", warm.median <= WARM_GOAL_S,
                _fmt(warm.median))
    for row, limit in BUILD_GOALS.items():
        a, b = stat(row, "opbuilder", "seconds"), stat(row, "torch", "seconds")
        if a is not None and b is not None:
            r = ratio(a, b)
            report.goal(f"{dict(labels)[row]}: opbuilder <= {limit}x torch's (wall)", r.median <= limit,
                        f"{r.median:.2f}x")
    return report.finish()

if __name__ == "__main__":
    sys.exit(main())
