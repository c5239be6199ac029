"""Builder speed: opbuilder against PyTorch's cpp_extension.load (and tvm-ffi), measured in the same run.

    python benchmarks/builder.py [--samples 3] [--warm-runs 9] [--no-torch] [--no-tvm] [--keep] [--warm-only]
    python benchmarks/builder.py --bindings [--rounds 3] [--no-tvm]

Run time: about 20 minutes with torch (both of its columns) and the default 3 samples on a quiet 2-core
machine (a torch build takes ~35 s without its PCH), about 3 minutes with ``--no-torch``.

The operator is the demo's multiply (custom_src/function_ops.cpp); for PyTorch, the same multiply as a
torch::autograd::Function (benchmarks/torch_mul_op.cpp); for tvm-ffi (the package apache-tvm-ffi, an
optional peer column: skipped, and named, when it is not installed), the multiply's forward as a
tvm-ffi function (benchmarks/tvm_mul_op.cpp: tvm-ffi has no autograd Function, so it compiles less).
One source each, including one project header (``bench_config.h``) so that the header-edit scenario
exists. The one-file incremental scenario needs several sources: it edits ``extra.cpp`` of a second
operator built from the same source plus ``extra.cpp``. Every measurement runs in a new Python process
and times only the ``load()`` call (the framework is imported first); each framework builds into its
own fresh temporary directories, so nothing cached on this machine is used or touched.

Each row is timed interleaved (benchmarks/timing.py): every side once per sample, the order rotated each
sample, ``--samples`` samples each, so load from other processes falls on every side alike; every
figure is the median with the min-max, and a ratio is taken sample by sample (the sides ran back to
back). Rows compare like with like:
  first build             an empty cache / build directory on every side (opbuilder also probes the
                          toolchain, and builds nanobind's runtime unless it was installed)
  new operator, warm      a new operator (nothing built for it) with the shared state already warm on every
                          side (opbuilder: toolchain probe, nanobind runtime, PCH; torch: its extensions
                          directory): every later cold build
  warm load()             a new process loading the built operator
  warm: whole process     import + load() as a whole new process
  one-file incremental    extra.cpp of the two-source operator edited, rebuilt
  header-edit rebuild     bench_config.h edited, rebuilt in a new process
Precompiled headers, like with like (issue 38): opbuilder compiles a nanobind operator with its
precompiled ``opbuilder/extension.h`` (installed, or built in the cache). torch gets two columns:
``torch`` as cpp_extension.load builds by default (no PCH), and ``torch+PCH`` with
``<torch/extension.h>`` precompiled once with torch's own flags (unmeasured, as opbuilder's installed
one; cpp_extension's ``use_pch`` does the same for load_inline, but writes the .gch into torch's own
include directory, so this benchmark builds it in its temporary directory and adds ``-include`` of it).
The goals compare opbuilder with ``torch+PCH``; the ``torch`` column shows torch's default. Every side
compiles with the same optimisation flags (-O2 -ftree-vectorize -fvect-cost-model=dynamic, passed to
torch and tvm-ffi as extra flags); each side's flags and PCH are printed before the tables.
``--warm-only`` builds once and measures only the warm rows (opbuilder alone), and says whether the warm
``load()`` meets its goal of 2 ms (WARM_GOAL_S).
The CPU table gives the CPU time (user + system) of the loading process and the processes it waited
for during ``load()`` (compilers, ninja), on every side alike -- steadier than wall time on a shared
machine. Work opbuilder leaves running in the background after ``load()`` returns (a detached PCH
compile) is not in that figure; it is printed on its own line.
Child processes run with bytecode caching on (as an installed package has), after one unmeasured run
that writes it. Goal lines (MET/MISSED) follow the tables, each with the load average when it was
printed.

``--bindings`` compares the binding layers, interleaved (A B C ... A B C ..., medians with min-max over
``--rounds``), each a new process and a fresh cache: the README operator bound with nanobind (its
runtime already built / not yet built, i.e. a newcomer's first operator, whose ``load()`` also starts
the detached PCH compile: its CPU is its own column), the same with -flto off, the binding source edited
and loaded again, the same source bound with pybind11 (no PCH yet, as a newcomer), tvm-ffi's new
operator (benchmarks/tvm_mul_op.cpp, fresh build directory), and the floors: a bare one-function
nanobind module compiled and linked against the prebuilt libnanobind with exactly the README
operator's compile flags and link command (read from its build.ninja; no PCH), and a bare pybind11
module (-O2). Its goal (issue 38 goal 6): the new operator's compiler CPU at most 1.3x the bare
nanobind module's, round by round. A third floor says what the goal leaves out: the operator's own
kernel (its source without Function<T> and its binding, one trivial function bound instead), compiled
with the operator's command and PCH; the operator over it is opbuilder's glue. A fourth adds its Forward and
Backward as plain functions (all the code the operator's author wrote, no Function<T>, no binding of them):
over the bare module it is the least any glue could reach. After the table, ``-ftime-report`` of the operator's compile and of
the bare module's, phase by phase, says where the difference goes.
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
from typing import Callable, Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing  # noqa: E402  (first: pins the thread count before numpy and torch load)
from timing import Report, Stat, ratio  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEMO_SOURCE = ROOT / "custom_src" / "function_ops.cpp"
TORCH_SOURCE = Path(__file__).resolve().parent / "torch_mul_op.cpp"
TVM_SOURCE = Path(__file__).resolve().parent / "tvm_mul_op.cpp"
SAME_FLAGS = ["-O2", "-ftree-vectorize", "-fvect-cost-model=dynamic"]  # opbuilder's optimisation flags
HEADER_USE = '\n#include "bench_config.h"\nint bench_config_value() { return BENCH_CONFIG; }\n'

OB_CHILD = """
import json, resource, sys, time
import runtime
from opbuilder import CustomOpBuilder
def _cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime
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
c2 = _cpu()
print(json.dumps({"seconds": t1 - t0, "cpu": sum(c1) - sum(c0), "compiler_cpu": c1[1] - c0[1],
                  "bg_cpu": sum(c2) - sum(c1)}))
"""

# BENCH_TORCH_PCH: a header whose .gch (torch/extension.h precompiled with torch's flags) sits beside it
TORCH_CHILD = """
import json, os, resource, sys, time
import torch
from torch.utils import cpp_extension
def _cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime
SAME_FLAGS = ["-O2", "-ftree-vectorize", "-fvect-cost-model=dynamic"]  # opbuilder's optimisation flags
pch = os.environ.get("BENCH_TORCH_PCH")
flags = SAME_FLAGS + (["-Winvalid-pch", "-include", pch] if pch else [])
name, build_dir, srcs = sys.argv[1], sys.argv[2], sys.argv[3:]
c0 = _cpu()
t0 = time.perf_counter()
m = cpp_extension.load(name, srcs, build_directory=build_dir, verbose=False, extra_cflags=flags)
t1 = time.perf_counter()
c1 = _cpu()
assert m.mul(torch.tensor([2.0]), torch.tensor([3.0])).item() == 6.0
print(json.dumps({"seconds": t1 - t0, "cpu": sum(c1) - sum(c0), "compiler_cpu": c1[1] - c0[1]}))
"""

TVM_CHILD = """
import json, resource, sys, time
import numpy as np
import tvm_ffi.cpp
def _cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime
SAME_FLAGS = ["-O2", "-ftree-vectorize", "-fvect-cost-model=dynamic"]  # opbuilder's optimisation flags
name, build_dir, srcs = sys.argv[1], sys.argv[2], sys.argv[3:]
c0 = _cpu()
t0 = time.perf_counter()
m = tvm_ffi.cpp.load(name, cpp_files=srcs, build_directory=build_dir, extra_cflags=SAME_FLAGS)
t1 = time.perf_counter()
c1 = _cpu()
x, y = np.array([2.0], dtype=np.float32), np.array([3.0], dtype=np.float32)
out = np.empty_like(x)
m.mul(x, y, out)
assert out[0] == 6.0
print(json.dumps({"seconds": t1 - t0, "cpu": sum(c1) - sum(c0), "compiler_cpu": c1[1] - c0[1]}))
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


FRAMEWORKS = ("opbuilder", "torch", "torch+PCH", "tvm-ffi")  # the sides, in table order


class Side:
    """One framework's fresh work directory: sources, a shared cache (or extensions directory) and how a
    new process loads an operator there. ``torch+PCH`` is torch with ``pch`` (a header whose precompiled
    .gch sits beside it, see ``build_torch_pch``) passed as ``-include``."""

    def __init__(self, framework: str, work: Path, pch: Optional[Path] = None) -> None:
        self.framework, self.work, self.pch = framework, work, pch
        source, stem = {"opbuilder": (DEMO_SOURCE, "ob_op"), "tvm-ffi": (TVM_SOURCE, "tvm_op")}.get(
            framework, (TORCH_SOURCE, "torch_op"))
        self.main, self.extra = _sources(work / "src", source, stem)
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

    def _child(self, name: str, state: Path) -> Tuple[str, List[str], Dict[str, str]]:
        """The measuring child's code, arguments and environment for ``load()`` of ``name`` in ``state``."""
        if self.framework == "opbuilder":
            return OB_CHILD, [name, *self.ops[name]], _env(OPBUILDER_CACHE_DIR=str(state / "cache"))
        build_dir = state / "build" / name  # torch and tvm-ffi keep one build.ninja per directory
        build_dir.mkdir(parents=True, exist_ok=True)
        if self.framework == "tvm-ffi":
            return TVM_CHILD, [name, str(build_dir), *self.ops[name]], _env()
        extra = {"BENCH_TORCH_PCH": str(self.pch)} if self.pch is not None else {}
        return TORCH_CHILD, [name, str(build_dir), *self.ops[name]], _env(TORCH_EXTENSIONS_DIR=str(state / "ext"),
                                                                         **extra)

    def load(self, name: str, fresh: Optional[str] = None) -> Dict[str, float]:
        """``load()`` of ``name`` in a new process: in the shared state, or in a new empty one (``fresh``)."""
        code, args, env = self._child(name, self._state(fresh))
        return _run(code, args, env)

    def whole_process(self) -> Dict[str, float]:
        """Seconds of a whole new process: import + warm load() of bench_ops in the shared state (the
        measuring child itself, timed from outside)."""
        import time
        code, args, env = self._child("bench_ops", self._state(None))
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code, *args], check=True, capture_output=True, env=env, timeout=600)
        return {"seconds": time.perf_counter() - t0}

    def flags(self) -> str:
        """What this side compiles with, in words (printed above the tables)."""
        if self.framework == "opbuilder":
            return ("its own flags (-O2 -ftree-vectorize -fvect-cost-model=dynamic -fvisibility=hidden ...); "
                    + _ob_pch_state(self.work / "shared" / "cache", "bench_ops"))
        if self.framework == "tvm-ffi":
            return "tvm-ffi's flags (-std=c++17 -fPIC -O2) + " + " ".join(SAME_FLAGS) + "; no PCH"
        return ("torch's flags + " + " ".join(SAME_FLAGS)
                + (f"; PCH: <torch/extension.h> precompiled with torch's flags (-include {self.pch.name})"
                   if self.pch is not None else "; no PCH (cpp_extension.load's default)"))


def _ninja_rules(build_ninja: Path) -> Dict[str, str]:
    """``{rule name: command, build output: its "extra" variable}`` of an opbuilder build.ninja."""
    out: Dict[str, str] = {}
    rule = target = None
    for line in build_ninja.read_text().splitlines():
        if line.startswith("rule "):
            rule, target = line.split()[1], None
        elif line.startswith("build "):
            target, rule = line[6:].split(":", 1)[0].strip(), None
        elif line.startswith("  command = ") and rule:
            out[rule] = line[len("  command = "):]
        elif line.startswith("  extra = ") and target:
            out["extra:" + target] = line[len("  extra = "):]
    return out


def _ob_compile(cache: Path, name: str) -> Optional[Tuple[List[str], List[str], Path, str]]:
    """The operator ``name``'s compile in ``cache``, as its build.ninja has it: (compile command without
    its input and output, link command without them, the directory it runs in, its PCH state in words);
    None when it was not built there."""
    import shlex
    bdir = cache / name / "build"
    try:
        rules = _ninja_rules(bdir / "build.ninja")
    except OSError:
        return None
    extra = next((v for k, v in rules.items() if k.startswith("extra:")), "")
    cxx = rules["cxx"].replace("-MD -MF $out.d ", "").replace("$extra", extra)
    cxx = [a for a in shlex.split(cxx) if a not in ("-c", "$in", "-o", "$out")]
    link = [a for a in shlex.split(rules["link"]) if a not in ("-o", "$out", "$in")]
    return cxx, link, bdir, _pch_words(shlex.split(extra), bdir)


def _pch_words(extra: List[str], bdir: Path) -> str:
    pch = next((Path(extra[i + 1]) for i, a in enumerate(extra[:-1]) if a == "-include" and
                extra[i + 1].endswith("pch.h")), None)
    if pch is None:
        return "no PCH"
    pch = (bdir / pch).resolve()
    where = "installed" if "_native" in pch.parts else "built in the cache"
    if not pch.with_name("pch.h.gch").is_file():
        return f"PCH ({where}) not built yet: opbuilder/extension.h read as text"
    return f"PCH of opbuilder/extension.h ({where})"


def _ob_pch_state(cache: Path, name: str) -> str:
    got = _ob_compile(cache, name)
    return got[3] if got is not None else "PCH: not known (not built)"


def build_torch_pch(work: Path) -> Path:
    """``<torch/extension.h>`` precompiled with the flags cpp_extension.load compiles a source with (read
    from the build.ninja of one unmeasured build), into ``work``; the header to ``-include``."""
    import shlex
    probe = work / "probe"
    src = _sources(probe / "src", TORCH_SOURCE, "torch_probe")[0]
    build = probe / "build"
    build.mkdir(parents=True, exist_ok=True)
    code = ("import sys; from torch.utils import cpp_extension; cpp_extension.load('torch_probe', [sys.argv[1]], "
            f"build_directory=sys.argv[2], extra_cflags={SAME_FLAGS!r})")
    subprocess.run([sys.executable, "-c", code, src, str(build)], check=True, capture_output=True,
                   env=_env(TORCH_EXTENSIONS_DIR=str(probe / "ext")), timeout=1800)
    ninja = (build / "build.ninja").read_text()
    var = {k.strip(): v.strip() for k, v in (ln.split("=", 1) for ln in ninja.splitlines()
                                             if "=" in ln and not ln.startswith((" ", "rule", "build")))}
    flags = [a for a in shlex.split(var.get("cflags", "") + " " + var.get("post_cflags", ""))
             if not a.startswith(("-DTORCH_EXTENSION_NAME=", "-MD", "-MF"))]
    header = work / "torch_pch.h"
    header.write_text("#include <torch/extension.h>\n")
    subprocess.run([var.get("cxx", "c++"), *flags, "-x", "c++-header", str(header), "-o",
                    str(header.with_name(header.name + ".gch"))], check=True, timeout=1800)
    return header


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


def _timed(cmds: List[List[str]], cwd: Optional[Path] = None) -> Dict[str, float]:
    """Wall seconds and CPU (user + system of the child processes) of ``cmds``, run one after another."""
    import time
    r0 = os.times()
    t0 = time.perf_counter()
    for cmd in cmds:
        subprocess.run(cmd, check=True, cwd=cwd)
    t1 = time.perf_counter()
    r1 = os.times()
    cpu = (r1.children_user - r0.children_user) + (r1.children_system - r0.children_system)
    return {"seconds": t1 - t0, "cpu": cpu, "compiler_cpu": cpu}


def _bare_pybind11(work: Path) -> Dict[str, float]:
    """A bare one-function pybind11 module compiled and linked by the compiler directly (-O2, no PCH)."""
    import sysconfig
    import pybind11
    src = work / "bare_pybind11.cpp"
    src.write_text(BARE_PYBIND11)
    return _timed([[os.environ.get("CXX") or "c++", "-std=c++17", "-O2", "-fPIC", "-shared", "-fvisibility=hidden",
                    "-isystem", pybind11.get_include(), "-isystem", sysconfig.get_paths()["include"], str(src),
                    "-o", str(work / "bare_pybind11.so")]])


def _bare_nanobind(work: Path, compile_cmd: List[str], link_cmd: List[str], cwd: Path,
                   time_report: bool = False) -> Dict[str, float]:
    """The floor: a bare one-function nanobind module compiled with the operator's own compile command
    (its flags, without its ``-include``s: no PCH) and linked with its link command, against the prebuilt
    libnanobind. With ``time_report``: g++'s -ftime-report of the compile instead (``report``)."""
    src = work / "bare_nanobind.cpp"
    src.write_text(BARE_NANOBIND)
    cmd, i = [], 0
    while i < len(compile_cmd):  # the operator's flags without its -include (PCH, module name)
        if compile_cmd[i] == "-include":
            i += 2
            continue
        cmd.append(compile_cmd[i])
        i += 1
    obj, lib = work / "bare_nanobind.o", work / "bare_nanobind.so"
    if time_report:
        return {"report": _time_report(cmd + ["-c", str(src), "-o", str(obj)], cwd)}
    return _timed([cmd + ["-c", str(src), "-o", str(obj)], link_cmd + ["-o", str(lib), str(obj)]], cwd)


def _kernel_floor(work: Path, compile_cmd: List[str], link_cmd: List[str], cwd: Path) -> Dict[str, float]:
    """The README operator's own code without opbuilder's glue: its source up to `class CustomMul` (the
    kernel: Mul and its helpers, kept by one exported function) and a module binding one trivial function,
    compiled with the operator's own command (its PCH included) and linked the same way."""
    text = DEMO_SOURCE.read_text()
    src = work / "kernel_floor.cpp"
    src.write_text(text[:text.index("class CustomMul")] +
                   "TensorPtr ExportedMul(const TensorPtr &x, const TensorPtr &y) { return Mul(x, y); }\n"
                   "OB_MODULE(m) { m.def(\"f\", [](int a) { return a + 1; }); }\n")
    obj, lib = work / "kernel_floor.o", work / "kernel_floor.so"
    return _timed([compile_cmd + ["-c", str(src), "-o", str(obj)], link_cmd + ["-o", str(lib), str(obj)]], cwd)


def _own_code_floor(work: Path, compile_cmd: List[str], link_cmd: List[str], cwd: Path) -> Dict[str, float]:
    """The README operator's own code, all of it, without opbuilder's glue: its kernel and its Forward and
    Backward as plain static functions (the class without ``: public Function<CustomMul>``, each kept by an
    exported function), one trivial function bound; the operator's command and PCH, linked the same way.
    The operator over this is what Function<T> and the binding of ``mul`` add."""
    text = DEMO_SOURCE.read_text()
    cls = text[text.index("class CustomMul"):text.index("// nanobind (the builder")]
    src = work / "own_code_floor.cpp"
    src.write_text(text[:text.index("class CustomMul")] +
                   cls.replace("class CustomMul : public Function<CustomMul> {", "class CustomMul {") +
                   "TensorPtr ExportedForward(AutogradContext *c, const TensorPtr &x, const TensorPtr &y) "
                   "{ return CustomMul::Forward(c, x, y); }\n"
                   "TensorPtrList ExportedBackward(AutogradContext *c, TensorPtrList g) "
                   "{ return CustomMul::Backward(c, std::move(g)); }\n"
                   "OB_MODULE(m) { m.def(\"f\", [](int a) { return a + 1; }); }\n")
    obj, lib = work / "own_code_floor.o", work / "own_code_floor.so"
    return _timed([compile_cmd + ["-c", str(src), "-o", str(obj)], link_cmd + ["-o", str(lib), str(obj)]], cwd)


def _time_report(cmd: List[str], cwd: Path) -> str:
    res = subprocess.run(cmd + ["-ftime-report"], cwd=cwd, capture_output=True, text=True)
    return res.stderr


def _phases(report: str) -> Dict[str, float]:
    """``{time variable: user + system seconds}`` of one -ftime-report."""
    import re
    out: Dict[str, float] = {}
    for line in report.splitlines():
        m = re.match(r"\s*(.+?)\s*:\s*([\d.]+)\s*\(\s*\d+%\)\s*([\d.]+)\s*\(\s*\d+%\)", line)
        if m:
            out[m.group(1).lstrip("|")] = float(m.group(2)) + float(m.group(3))
        elif line.strip().startswith("TOTAL"):
            parts = line.split(":")[1].split()
            out["TOTAL"] = float(parts[0]) + float(parts[1])
    return out


def print_time_report(op: str, bare: str) -> None:
    """The operator's compile and the bare module's, phase by phase (g++ -ftime-report, user + system s)."""
    a, b = _phases(op), _phases(bare)
    if not a:
        print("-ftime-report: the compiler printed none (not g++?)")
        return
    print("\nwhere the operator's compile goes, against the bare nanobind module (g++ -ftime-report, "
          "user + system seconds, one run each, same flags; the operator with its PCH):")
    names = [n for n in a if n.startswith("phase ")] + ["TOTAL"]
    top = sorted((n for n in a if not n.startswith("phase ") and n != "TOTAL"), key=lambda n: -a[n])[:8]
    timing.table(["time variable", "README op", "bare nanobind", "difference"],
                 [[n, f"{a.get(n, 0):.2f}", f"{b.get(n, 0):.2f}", f"{a.get(n, 0) - b.get(n, 0):+.2f}"]
                  for n in names + top])


def bindings(work: Path, rounds: int, use_tvm: bool = False) -> int:
    """The ``--bindings`` table (see the module docstring)."""
    digest = _sources_digest()
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
    # the README operator's compile and link commands, as the builder runs them (for the bare module)
    probe = work / "probe-cache"
    shutil.copytree(base, probe, symlinks=True)
    probe_src = src_dir / "probe.cpp"
    probe_src.write_text(DEMO_SOURCE.read_text() + "\n// probe\n")
    _run(OB_CHILD, ["bench_nb", str(probe_src)], _env(OPBUILDER_CACHE_DIR=str(probe)))
    got = _ob_compile(probe, "bench_nb")
    if got is None:
        raise SystemExit(f"no build.ninja of the README operator under {probe}")
    op_cmd, link_cmd, op_dir, op_pch = got
    samples: Dict[str, List[Dict[str, float]]] = {}

    def fresh(tag: str, with_runtime: bool) -> Path:
        d = work / f"{tag}-{len(samples.get(tag, []))}"
        if with_runtime:
            shutil.copytree(base, d, symlinks=True)
        else:
            d.mkdir(mode=0o700)
        return d

    def op_source(tag: str, r: int, source: Path = DEMO_SOURCE) -> str:
        p = src_dir / f"{tag}_{r}.cpp"
        p.write_text(source.read_text() + f"\n// {tag} round {r}\n")
        return str(p)

    def add(tag: str, res: Dict[str, float]) -> None:
        samples.setdefault(tag, []).append(res)

    for r in range(rounds):
        print(f"  round {r + 1}/{rounds} ...", file=sys.stderr, flush=True)
        add("nb_new", _run(OB_CHILD, ["bench_nb", op_source("nb_new", r)],
                           _env(OPBUILDER_CACHE_DIR=str(fresh("nb_new", True)))))
        add("bare_nanobind", _bare_nanobind(work, op_cmd, link_cmd, op_dir))
        add("kernel_floor", _kernel_floor(work, op_cmd, link_cmd, op_dir))
        add("own_code_floor", _own_code_floor(work, op_cmd, link_cmd, op_dir))
        add("bare_pybind11", _bare_pybind11(work))
        add("nb_first", _run(OB_CHILD, ["bench_nb", op_source("nb_first", r)],
                             _env(OPBUILDER_CACHE_DIR=str(fresh("nb_first", False)))))
        cache = fresh("nb_nolto", True)
        src = op_source("nb_nolto", r)
        add("nb_nolto", _run(OB_CHILD, ["bench_nb", src], _env(OPBUILDER_CACHE_DIR=str(cache), OPBUILDER_LTO="0")))
        _edit(Path(src), f"// nb_nolto round {r}", f"// nb_nolto round {r}, edited")
        add("nb_edit", _run(OB_CHILD, ["bench_nb", src], _env(OPBUILDER_CACHE_DIR=str(cache))))
        add("pb_first", _run(OB_CHILD, ["bench_pb", "--binding=pybind11", op_source("pb_first", r)],
                             _env(OPBUILDER_CACHE_DIR=str(fresh("pb_first", False)), OPBUILDER_PCH="0")))
        if use_tvm:
            add("tvm_new", _run(TVM_CHILD, ["bench_tvm", str(fresh("tvm_new", False)),
                                            op_source("tvm_new", r, TVM_SOURCE)], _env()))

    def stat(tag: str, what: str) -> str:
        v = [x.get(what) for x in samples[tag]]
        if None in v:
            return "-"
        return Stat(v).fmt("s")

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"binding benchmark: {_compiler()}; {cores} cores; {rounds} interleaved rounds; load average "
          f"{os.getloadavg()[0]:.2f} at the end")
    print(f"the README operator's compile: {' '.join(op_cmd)}\n  its PCH: {op_pch}\n"
          "the bare nanobind module: the same command without its -include (no PCH), then the same link")
    rows = [("nb_new", "nanobind README op, runtime built"), ("nb_first", "nanobind, first op (runtime too)"),
            ("nb_nolto", "nanobind, runtime built, -flto off"), ("nb_edit", "nanobind, binding source edited"),
            ("pb_first", "pybind11 README op, no PCH"), ("tvm_new", "tvm-ffi new op (forward only), -O2 + same"),
            ("bare_nanobind", "bare nanobind module, the op's flags"),
            ("kernel_floor", "the op's kernel alone, the op's command + PCH"),
            ("own_code_floor", "the op's kernel, Forward, Backward, no glue; same"),
            ("bare_pybind11", "bare pybind11 module, -O2")]
    timing.table(["", "wall", "CPU (process + compiler)", "compiler CPU", "background CPU after load()"],
                 [[label, stat(tag, "seconds"), stat(tag, "cpu"), stat(tag, "compiler_cpu"), stat(tag, "bg_cpu")]
                  for tag, label in rows if tag in samples])
    if not use_tvm:
        print("tvm-ffi: not measured (apache-tvm-ffi is not installed, or --no-tvm): its row is skipped")
    print_time_report(_time_report(op_cmd + ["-c", str(probe_src), "-o", str(work / "probe.o")], op_dir),
                      _bare_nanobind(work, op_cmd, link_cmd, op_dir, time_report=True)["report"])
    print()
    report = Report()
    if _sources_digest() != digest:
        report.fail("every row", "opbuilder's headers or core sources changed during the run (the core library "
                    "was rebuilt inside measured loads); run it again on an unchanged checkout")

    def col(tag: str, what: str) -> Stat:
        return Stat([x[what] for x in samples[tag]])

    for tag, limit, text in BINDING_GOALS:
        w = col(tag, "seconds")
        report.goal(f"{text} <= {limit:.1f} s wall (issue 21){_load()}", w.median <= limit, w.fmt("s"))
    r = ratio(col("nb_new", "compiler_cpu"), col("bare_nanobind", "cpu"))
    report.goal(f"new nanobind operator's compile <= 1.3x a bare nanobind module's, same flags, compiler CPU "
                f"(issue 38){_load()}", r.median <= 1.3, r.fmt("x"))
    k = ratio(col("nb_new", "compiler_cpu"), col("kernel_floor", "cpu"))
    glue = Stat([a["compiler_cpu"] - b["cpu"] for a, b in zip(samples["nb_new"], samples["kernel_floor"])])
    print(f"the same operator over its own kernel (its source without Function<T> and its binding, one trivial "
          f"function bound instead, same command and PCH): {k.fmt('x')}; opbuilder's glue {glue.fmt('s')} CPU")
    own = ratio(col("own_code_floor", "cpu"), col("bare_nanobind", "cpu"))
    print(f"the operator's own code (kernel, Forward and Backward as plain functions; no Function<T>, no binding "
          f"of them), same command and PCH, over the bare module: {own.fmt('x')}: a goal below this ratio is below "
          f"what the operator's author wrote, whatever the glue costs")
    first_bg = col("nb_first", "bg_cpu")
    print(f"a newcomer's first operator also starts the PCH compile in the background: {first_bg.fmt('s')} CPU "
          f"after its load() returned (not in its CPU columns)")
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
    ap.add_argument("--no-tvm", action="store_true", help="skip tvm-ffi even if it is installed")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directories (printed)")
    ap.add_argument("--warm-only", action="store_true", help="only the warm rows, opbuilder only (one build)")
    ap.add_argument("--bindings", action="store_true", help="nanobind against pybind11, interleaved")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of --bindings")
    args = ap.parse_args(argv)
    if args.bindings:
        work = Path(tempfile.mkdtemp(prefix="opbuilder-bench-"))
        os.chmod(work, 0o700)
        try:
            return bindings(work, args.rounds, use_tvm=not args.no_tvm and _tvm_available())
        finally:
            shutil.rmtree(work, ignore_errors=True) if not args.keep else print(f"kept {work}", file=sys.stderr)

    import importlib.util
    use_torch = not (args.no_torch or args.warm_only) and importlib.util.find_spec("torch") is not None
    use_tvm = not (args.no_tvm or args.warm_only) and _tvm_available()
    timing.header("builder: opbuilder against torch's cpp_extension.load and tvm-ffi", None,
                  timing.load_torch() if use_torch else None)
    print(f"each figure: median (min-max) of {args.samples} interleaved samples per side, warm rows of "
          f"{args.warm_runs} (whole process: {max(3, args.warm_runs // 3)}); ratios sample by sample")
    if not use_tvm and not args.warm_only:
        print("tvm-ffi: not measured (" + ("--no-tvm" if args.no_tvm else "apache-tvm-ffi is not installed: "
                                           "pip install apache-tvm-ffi==0.1.15") + "); its column is skipped")
    report = Report()
    digest = _sources_digest()
    work = Path(tempfile.mkdtemp(prefix="opbuilder-bench-"))
    os.chmod(work, 0o700)
    try:
        sides = [Side("opbuilder", work / "opbuilder")]
        if use_torch:
            print("  torch: precompiling <torch/extension.h> with torch's flags (unmeasured) ...", file=sys.stderr,
                  flush=True)
            sides += [Side("torch", work / "torch"), Side("torch+PCH", work / "torch-pch", build_torch_pch(work))]
        if use_tvm:
            sides.append(Side("tvm-ffi", work / "tvm"))
        rows = measure(sides, args.samples, args.warm_runs, args.warm_only)
        side_flags = {s.framework: s.flags() for s in sides}
    except (SystemExit, subprocess.CalledProcessError) as e:  # a child failed: its stderr is in the message
        report.fail("every row", e)
        return report.finish()
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)

    if _sources_digest() != digest:
        report.fail("every row", "opbuilder's headers or core sources changed during the run; run it again")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"{_compiler()}; {cores} cores; load average {os.getloadavg()[0]:.2f} at the end")
    for fw, text in side_flags.items():
        print(f"  {fw}: {text}")
    labels = [("first", "first build (empty cache / build dir)"), ("new_op", "new operator, warm shared state"),
              ("warm", "warm load() in a new process"), ("warm_process", "warm: whole new process, import + load"),
              ("incremental", "one-file incremental rebuild"), ("header", "header-edit rebuild")]
    peers = [fw for fw in FRAMEWORKS[1:] if fw in side_flags]

    def stat(row: str, fw: str, what: str) -> Optional[Stat]:
        got = rows.get(row, {}).get(fw)
        return Stat([x[what] for x in got]) if got and what in got[0] else None

    for what, title in (("seconds", "wall time"), ("cpu", "CPU time of the load() (less noisy)"),
                        ("compiler_cpu", "compiler CPU (the processes load() waited for)")):
        table = []
        for row, label in labels:
            a = stat(row, "opbuilder", what)
            if a is None:
                continue
            bs = [stat(row, fw, what) for fw in peers]
            table.append([label, a.fmt("auto")] + [b.fmt("auto") if b else "-" for b in bs]
                         + [ratio(a, b).fmt("x") if b else "-" for b in bs])
        if table:
            print()
            timing.table([title, "opbuilder"] + peers + [f"opbuilder / {fw}" for fw in peers], table)
    bg = [x.get("bg_cpu", 0.0) for r in rows.values() for x in r.get("opbuilder", [])]
    print(f"\nopbuilder's background work after load() (not in the CPU tables): "
          f"{max(bg) if bg else 0.0:.2f} s at most")
    if "tvm-ffi" in peers:
        print("tvm-ffi's operator is the multiply's forward only (no autograd Function): it compiles less")
    print()
    warm = stat("warm", "opbuilder", "seconds")
    report.goal(f"warm load() in a new process <= {_fmt(WARM_GOAL_S)} (docs/builder.md){_load()}",
                warm.median <= WARM_GOAL_S, _fmt(warm.median))
    like = "torch+PCH" if "torch+PCH" in peers else None  # like with like: both sides precompile their header
    for row, limit in BUILD_GOALS.items():
        a, b = stat(row, "opbuilder", "seconds"), stat(row, like, "seconds") if like else None
        if a is not None and b is not None:
            r = ratio(a, b)
            plain = stat(row, "torch", "seconds")
            also = f"; against torch without its PCH {ratio(a, plain).median:.2f}x" if plain is not None else ""
            report.goal(f"{dict(labels)[row]}: opbuilder <= {limit}x torch's, both with a PCH (wall){_load()}",
                        r.median <= limit, f"{r.fmt('x')}{also}")
    return report.finish()


def _sources_digest() -> str:
    """A digest of opbuilder's headers and core sources: a change during a run (another checkout user
    editing them) rebuilds the core library inside a measured load(), so the run is refused."""
    import hashlib
    h = hashlib.sha256()
    for f in sorted(list((ROOT / "include").rglob("*")) + list((ROOT / "src").rglob("*"))):
        if f.is_file():
            h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def _load() -> str:
    """The load average now, for a goal line: the figures beside it depend on it."""
    return f" [load average {os.getloadavg()[0]:.2f}]"


def _tvm_available() -> bool:
    import importlib.util
    return importlib.util.find_spec("tvm_ffi") is not None


if __name__ == "__main__":
    sys.exit(main())
