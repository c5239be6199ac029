"""Builder speed: opbuilder against PyTorch's cpp_extension.load, measured in the same run.

    python benchmarks/builder.py [--warm-runs 15] [--no-torch] [--keep] [--warm-only]
    python benchmarks/builder.py --bindings [--rounds 3]

The operator is the demo's multiply (custom_src/function_ops.cpp) and, for
PyTorch, the same multiply as a torch::autograd::Function
(benchmarks/torch_mul_op.cpp), one source each, including one project header
(``bench_config.h``) so that the header-edit scenario exists. The one-file
incremental scenario needs several sources: it edits ``extra.cpp`` of a
second operator built from the same source plus ``extra.cpp``. Every measurement runs in a new
Python process and times only the ``load()`` call (the framework is imported
first); each framework builds into its own fresh temporary directory, so
nothing cached on this machine is used or touched.

Rows:
  cold, no PCH yet        opbuilder's very first build with an empty cache:
                          toolchain probed, extension.h precompiled by a
                          background process nobody waits for
  cold, PCH present       a new operator (nothing built for it) once the
                          precompiled header exists: every later cold build
  warm load()             a new process loading the built operator (median)
  one-file incremental    extra.cpp of the two-source operator edited, rebuilt
  header-edit rebuild     bench_config.h edited, rebuilt in a new process
PyTorch has no PCH, so both cold rows compare with its one cold build.
``--warm-only`` builds once and measures only the warm rows (opbuilder alone),
and says whether the warm ``load()`` meets its goal of 2 ms (WARM_GOAL_S).
A second table gives the CPU time (user + system) of the loading process and
every process it started (compilers, ninja, and opbuilder's background PCH
compile, which the measuring child waits for after timing load()) --
steadier than wall time on a shared machine, and all the work a build costs.
Both sides compile with the same optimisation flags: torch adds no -O flag of
its own, so it gets opbuilder's (-O2 -ftree-vectorize
-fvect-cost-model=dynamic) through extra_cflags. What still differs:
opbuilder links a one-source pybind11 module with gcc's LTO (its choice, to use
every core for code generation; a nanobind module is built without) and precompiles its header; torch does neither.
Child processes run with bytecode caching on (as an installed package has),
after one unmeasured run that writes it.

The demo operator is bound with nanobind (OB_MODULE): its first cold build includes nanobind's
shared runtime, and there is no precompiled header; "cold build, PCH present" is then a new
operator with the runtime already built.

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
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional

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
assert m.mul(runtime.Tensor(2.0), runtime.Tensor(3.0)).item() == 6.0
import os
while True:  # every process the load started, the background precompile included, is counted
    try:
        os.wait()
    except ChildProcessError:
        break
print(json.dumps({"seconds": t1 - t0, "cpu": _cpu() - c0}))
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

IMPORT_CHILD = """
import json, sys, time
import runtime
t0 = time.perf_counter()
import opbuilder
print(json.dumps({"seconds": time.perf_counter() - t0}))
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


def _whole_process(code: str, env: Dict[str, str], runs: int) -> float:
    import time
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, env=env, timeout=600)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


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


def measure(framework: str, work: Path, warm_runs: int, warm_only: bool = False) -> Dict[str, float]:
    """Every scenario for one framework, each in new processes; seconds (``<row>_cpu``: CPU seconds).

    Cold, warm and header-edit rows use the demo operator as it is, one source; the
    incremental row needs several, so it edits extra.cpp of a two-source operator.
    """
    out: Dict[str, float] = {}
    main, extra = _sources(work / "src", DEMO_SOURCE if framework == "opbuilder" else TORCH_SOURCE,
                           "ob_op" if framework == "opbuilder" else "torch_op")
    ops = {"bench_ops": [main], "bench_multi": [main, extra], "bench_ops_again": [main]}

    if framework == "opbuilder":
        env = _env(OPBUILDER_CACHE_DIR=str(work / "cache"))

        def load(name: str) -> Dict[str, float]:
            return _run(OB_CHILD, [name, *ops[name]], env)
        whole = (f"import runtime; from opbuilder import CustomOpBuilder; "
                 f"CustomOpBuilder('bench_ops', {[main]!r}).load()")
    else:
        env = _env(TORCH_EXTENSIONS_DIR=str(work / "ext"))

        def load(name: str) -> Dict[str, float]:
            build_dir = work / "build" / name  # torch keeps one build.ninja per directory
            build_dir.mkdir(parents=True, exist_ok=True)
            return _run(TORCH_CHILD, [name, str(build_dir), *ops[name]], env)
        whole = (f"import torch; from torch.utils import cpp_extension; cpp_extension.load('bench_ops', "
                 f"{[main]!r}, build_directory={str(work / 'build' / 'bench_ops')!r}, "
                 f"extra_cflags=['-O2', '-ftree-vectorize', '-fvect-cost-model=dynamic'])")

    def build(row: str, name: str) -> None:
        res = load(name)
        out[row], out[row + "_cpu"] = res["seconds"], res["cpu"]

    print(f"  {framework}: cold build ...", file=sys.stderr, flush=True)
    build("cold", "bench_ops")
    from opbuilder.binding import PYBIND11, detect_binding
    if framework == "opbuilder" and detect_binding("bench_ops", [Path(main)]) == PYBIND11:
        _wait_for_pch(work / "cache")  # built in the background; let it finish before timing anything else
    load("bench_ops")  # unmeasured: writes bytecode caches for the warm runs
    out["warm"] = statistics.median(load("bench_ops")["seconds"] for _ in range(warm_runs))
    out["warm_process"] = _whole_process(whole, env, max(3, warm_runs // 3))
    if warm_only:
        return out
    print(f"  {framework}: incremental and header-edit rebuilds ...", file=sys.stderr, flush=True)
    load("bench_multi")  # unmeasured: the two-source operator's first build
    _edit(Path(extra), "return 1;", "return 2;")
    build("incremental", "bench_multi")
    _edit(Path(main).with_name("bench_config.h"), "BENCH_CONFIG 1", "BENCH_CONFIG 2")
    build("header", "bench_ops")
    if framework == "opbuilder":
        print("  opbuilder: cold build of a new operator, PCH present ...", file=sys.stderr, flush=True)
        build("cold_pch", "bench_ops_again")
        out["import"] = statistics.median(_run(IMPORT_CHILD, [], env)["seconds"]
                                          for _ in range(max(3, warm_runs // 3)))
    return out


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
    return 0


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
    ap.add_argument("--warm-runs", type=int, default=15, help="new processes per warm measurement (median)")
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

    try:
        import torch  # noqa: F401
        torch_version: Optional[str] = torch.__version__
    except ImportError:
        torch_version = None
    if args.no_torch or args.warm_only:
        torch_version = None

    work = Path(tempfile.mkdtemp(prefix="opbuilder-bench-"))
    os.chmod(work, 0o700)
    try:
        ob = measure("opbuilder", work / "opbuilder", args.warm_runs, args.warm_only)
        th = measure("torch", work / "torch", args.warm_runs) if torch_version else {}
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"builder benchmark: {_compiler()}; {cores} cores; Python {platform.python_version()}; "
          f"torch {torch_version or 'not installed'}; load average {os.getloadavg()[0]:.2f} at the end")
    rows = [("cold build, no PCH yet (empty cache)", "cold", "cold"),
            ("cold build, PCH present (new operator)", "cold_pch", "cold"),
            ("warm load() in a new process (median)", "warm", "warm"),
            ("warm: whole new process, import + load", "warm_process", "warm_process"),
            ("one-file incremental rebuild", "incremental", "incremental"),
            ("header-edit rebuild", "header", "header")]
    print(f"{'wall time':42s}{'opbuilder':>12s}{'torch load':>14s}{'ratio':>8s}")
    for label, ours, theirs in rows:
        a, b = ob.get(ours), th.get(theirs)
        ratio = f"{a / b:.3f}" if a is not None and b else "-"
        print(f"{label:42s}{_fmt(a):>12s}{_fmt(b):>14s}{ratio:>8s}")
    print(f"{'CPU time of the build (less noisy)':42s}")
    for label, ours, theirs in rows:
        a, b = ob.get(ours + "_cpu"), th.get(theirs + "_cpu")
        if a is not None:
            ratio = f"{a / b:.3f}" if b else "-"
            print(f"{label:42s}{_fmt(a):>12s}{_fmt(b):>14s}{ratio:>8s}")
    if ob.get("import") is not None:
        print(f"{'import opbuilder (after import runtime)':42s}{_fmt(ob.get('import')):>12s}")
    verdict = "within" if ob["warm"] <= WARM_GOAL_S else "OVER"
    print(f"warm load() {_fmt(ob['warm'])}: {verdict} its goal of {_fmt(WARM_GOAL_S)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
