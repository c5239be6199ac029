"""Shipping operators (issue 35): the first operator after installing opbuilder, a shipped operator's load,
and how many binaries a release needs.

    python benchmarks/ship.py [--rounds 3] [--load-rounds 15] [--rows first,shipped,builds] [--work DIR]
                              [--second-torch PYTHON] [--no-torch-ext]

About 4 minutes on a quiet 2-core machine with every row (first time: the wheels and the 3.12/3.13 venvs
are made in --work, ~2 minutes more, kept there for the next run when --work is given).

Rows, each process new:
  first operator   a trivial operator (add one, float32) with ``opbuilder.load_inline`` in a fresh cache,
                   opbuilder installed from its wheel (its native runtime inside: only the operator
                   compiles), interleaved with tvm-ffi's ``tvm_ffi.cpp.load_inline`` on the same operator
                   in a fresh build directory (package apache-tvm-ffi: skipped, saying so, when absent) and,
                   for reference, opbuilder from this checkout with no installed runtime (it builds its
                   runtime in the cache first: the state before issue 35). Wall time of the call, and its
                   compiler CPU time (the processes it waited for: compiler, ninja). Goals: <= 1.0 s wall
                   (on a quiet machine) and <= 0.5x tvm-ffi's compiler CPU, round by round.
  shipped load     examples/shipped_pkg installed from its wheel, with no compiler (CXX=/bin/false,
                   OPBUILDER_NO_BUILD=1): ``import runtime``, then ``import shipped_pkg`` (which calls
                   ``CustomOpBuilder(...).load()``), timed inside a new process; the child processes it
                   starts are counted by an audit hook (subprocess, exec, spawn, fork). Also the whole
                   process against one that only imports runtime. Goals: <= 3 ms over ``import runtime``,
                   0 child processes.
  builds needed    one operator binary across Python 3.12/3.13 (an abi3 wheel built under pyenv's 3.12,
                   installed into 3.12 and 3.13 venvs) and across torch versions (the cp311 wheel under
                   this torch and a second one, --second-torch or OPBUILDER_SECOND_TORCH_PYTHON): each
                   loads the file with no compiler and checks values and gradients; the SHA-256s are
                   compared. torch's cpp_extension side: benchmarks/torch_mul_op.cpp built under this
                   torch, what it links (readelf) and whether the second torch imports it. What cannot be
                   set up here (a missing Python, no second torch) is named, not counted.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing  # noqa: E402  (first: pins the thread count before numpy and torch load)
from timing import Report, Stat, Unmeasured, ratio  # noqa: E402

ROOT = timing.ROOT
EXAMPLE = ROOT / "examples" / "shipped_pkg"
TORCH_EXT_SOURCE = timing.HERE / "torch_mul_op.cpp"
NO_CXX = {"CXX": "/bin/false", "CC": "/bin/false", "OPBUILDER_NO_BUILD": "1"}
FIRST_WALL_GOAL_S, FIRST_CPU_GOAL, SHIPPED_GOAL_S = 1.0, 0.5, 0.003

_CPU = """
import json, resource, sys, time
def _cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime
"""
OB_FIRST = _CPU + r'''
import numpy as np
import opbuilder
SRC = """
using namespace opbuilder;
TensorPtr add_one(const TensorPtr &x) {
  auto y = Tensor::empty_like(x);
  const float *a = x->data<float>();
  float *o = y->data<float>();
  for (int64_t i = 0; i < x->numel(); ++i) o[i] = a[i] + 1;
  return y;
}
"""
c0, t0 = _cpu(), time.perf_counter()
m = opbuilder.load_inline("first_op", SRC, functions=["add_one"])
t1, c1 = time.perf_counter(), _cpu()
assert m.add_one(np.arange(3, dtype=np.float32)).asnumpy().tolist() == [1, 2, 3]
print(json.dumps({"seconds": t1 - t0, "compiler_cpu": c1[1] - c0[1], "cpu": c1[0] - c0[0] + c1[1] - c0[1]}))
'''
TVM_FIRST = _CPU + r'''
import numpy as np
import tvm_ffi.cpp
SRC = """
void add_one(tvm::ffi::TensorView x, tvm::ffi::TensorView y) {
  const float *a = static_cast<float *>(x.data_ptr());
  float *o = static_cast<float *>(y.data_ptr());
  for (int64_t i = 0; i < x.size(0); ++i) o[i] = a[i] + 1;
}
"""
c0, t0 = _cpu(), time.perf_counter()
m = tvm_ffi.cpp.load_inline("first_op", cpp_sources=SRC, functions=["add_one"], build_directory=sys.argv[1])
t1, c1 = time.perf_counter(), _cpu()
x = np.arange(3, dtype=np.float32)
y = np.empty_like(x)
m.add_one(x, y)
assert y.tolist() == [1, 2, 3]
print(json.dumps({"seconds": t1 - t0, "compiler_cpu": c1[1] - c0[1], "cpu": c1[0] - c0[0] + c1[1] - c0[1]}))
'''
# a new process: import runtime, then (with an argument) the shipped package, whose import calls load()
SHIPPED = r'''
import sys, time
t0 = time.perf_counter()
import runtime
t1 = time.perf_counter()
spawned = []
sys.addaudithook(lambda e, a: spawned.append(e) if e.split(".")[0] in ("subprocess", "os") and e.split(".")[1] in
                 ("Popen", "exec", "posix_spawn", "spawn", "fork", "forkpty", "system") else None)
c1 = time.thread_time()
if len(sys.argv) > 1:
    import shipped_pkg
    assert shipped_pkg.sq_mul(runtime.Tensor(2.0), runtime.Tensor(3.0)).item() == 12.0
t2, c2 = time.perf_counter(), time.thread_time()
import json
print(json.dumps({"runtime": t1 - t0, "package": t2 - t1, "package_cpu": c2 - c1, "spawned": spawned,
                  "lib": shipped_pkg.ops.__file__ if len(sys.argv) > 1 else None}))
'''
# the floor of a shipped load: the same binary imported directly (after the libraries it loads first), no checks
SHIPPED_FLOOR = r'''
import ctypes, importlib.machinery, importlib.util, json, sys, time
import runtime
libs, path = json.loads(sys.argv[1]), sys.argv[2]
t1, c1 = time.perf_counter(), time.thread_time()
for lib in libs:
    ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
loader = importlib.machinery.ExtensionFileLoader("shipped_ops", path)
m = importlib.util.module_from_spec(importlib.machinery.ModuleSpec("shipped_ops", loader, origin=path))
loader.exec_module(m)
assert m.sq_mul(runtime.Tensor(2.0), runtime.Tensor(3.0)).item() == 12.0
t2, c2 = time.perf_counter(), time.thread_time()
print(json.dumps({"package": t2 - t1, "package_cpu": c2 - c1}))
'''
# the shipped operator's values and gradients with no compiler; with torch (argument "torch") through to_torch
CHECK = r'''
import hashlib, json, sys
import numpy as np
use_torch = sys.argv[1:] == ["torch"]
if use_torch:
    import torch
import runtime as rt, shipped_pkg
lib = shipped_pkg.ops.__file__
r = np.random.default_rng(0)
x0, y0 = r.standard_normal(5), r.standard_normal(5)
if use_torch:
    import opbuilder
    ops = opbuilder.to_torch(shipped_pkg.ops)
    x, y = (torch.tensor(v, requires_grad=True) for v in (x0, y0))
    z = ops.sq_mul(x, y)
    z.sum().backward()
    out, gx, gy, version = z.detach().numpy(), x.grad.numpy(), y.grad.numpy(), torch.__version__
else:
    x, y = rt.Parameter(rt.Tensor(x0, rt.float64)), rt.Parameter(rt.Tensor(y0, rt.float64))
    out = shipped_pkg.sq_mul(x, y).asnumpy()
    gx, gy = (g.asnumpy() for g in rt.grad(lambda a, b: shipped_pkg.sq_mul(a, b).sum(), grad_position=(0, 1))(x, y))
    version = "-"
ok = np.allclose(out, x0 * x0 * y0, rtol=1e-14) and np.allclose(gx, 2 * x0 * y0, rtol=1e-14) \
    and np.allclose(gy, x0 * x0, rtol=1e-14)
print(json.dumps({"file": lib, "sha256": hashlib.sha256(open(lib, "rb").read()).hexdigest(), "ok": bool(ok),
                  "torch": version, "python": "%d.%d" % sys.version_info[:2]}))
'''


def _env(site: Optional[Path], **extra: str) -> Dict[str, str]:
    """A child's environment: ``site`` (installed wheels) on PYTHONPATH instead of this checkout (or the
    checkout when None), no OPBUILDER_* setting of ours; threads pinned as timing.py does."""
    env = {k: v for k, v in timing.child_env().items() if not k.startswith("OPBUILDER_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as an installed package: bytecode cached after the first run
    env["PYTHONPATH"] = str(site) if site is not None else str(ROOT)
    env.update(extra)
    return env


def _json(args: List[str], env: Dict[str, str], what: str, cwd: Path) -> dict:
    """The last stdout line of a child run in ``cwd`` (not the checkout: ``python -c`` imports from its cwd)."""
    return json.loads(_run_in(args, env, what, cwd).stdout.strip().splitlines()[-1])


def _run_in(args: List[str], env: Dict[str, str], what: str, cwd: Path) -> subprocess.CompletedProcess:
    res = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env, cwd=str(cwd), timeout=1800)
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise Unmeasured(f"{what} exited {res.returncode}: {tail[0]}")
    return res


def wheels(python: str, work: Path, tag: str) -> Path:
    """opbuilder's wheel and examples/shipped_pkg's, built with ``python`` (its own environment must have
    hatchling, nanobind, pybind11, ninja, filelock, numpy) and installed into ``work/tag/site``; that
    directory. Reused when already there (--work)."""
    d = work / tag
    site = d / "site"
    if (d / "done").exists():
        return site
    shutil.rmtree(d, ignore_errors=True)
    (d / "dist").mkdir(parents=True)
    pip = [python, "-m", "pip", "-q", "--disable-pip-version-check"]
    print(f"  {tag}: building opbuilder's and shipped_pkg's wheels (unmeasured) ...", file=sys.stderr, flush=True)
    _run_in([*pip, "wheel", "--no-build-isolation", "--no-deps", "-w", d / "dist", ROOT], _env(None), "pip wheel", d)
    _run_in([*pip, "install", "--no-deps", "--target", site, *glob.glob(str(d / "dist" / "opbuilder-*.whl"))],
            _env(None), "pip install", d)
    src = d / "shipped_pkg"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("__pycache__", "build", "dist", "*.egg-info"))
    _run_in([*pip, "wheel", "--no-build-isolation", "--no-deps", "-w", d / "dist", src], _env(site), "pip wheel", d)
    _run_in([*pip, "install", "--no-deps", "--target", site, *glob.glob(str(d / "dist" / "shipped_pkg-*.whl"))],
            _env(None), "pip install", d)
    (d / "done").touch()
    return site


def _tvm_available() -> bool:
    import importlib.util
    return importlib.util.find_spec("tvm_ffi") is not None


def first_operator(work: Path, site: Path, rounds: int, report: Report) -> None:
    """The first-operator row (see the module docstring)."""
    cases = {"opbuilder, installed": lambda i: _json([sys.executable, "-c", OB_FIRST],
                                                     _env(site, OPBUILDER_CACHE_DIR=str(work / f"ob-{i}")),
                                                     "opbuilder's first operator", work),
             "opbuilder, runtime not installed": lambda i: _json(
                 [sys.executable, "-c", OB_FIRST], _env(None, OPBUILDER_CACHE_DIR=str(work / f"jit-{i}"),
                                                        OPBUILDER_INSTALLED_RUNTIME="0"), "opbuilder (JIT runtime)", work)}
    if _tvm_available():
        cases["tvm-ffi"] = lambda i: _json([sys.executable, "-c", TVM_FIRST, work / f"tvm-{i}"], _env(None),
                                           "tvm-ffi's first operator", work)
    else:
        print("apache-tvm-ffi is not installed (pip install apache-tvm-ffi): its column and goal are skipped")
    names = list(cases)
    got: Dict[str, List[dict]] = {n: [] for n in names}
    for r in range(rounds):
        print(f"  first operator: round {r + 1}/{rounds} ...", file=sys.stderr, flush=True)
        for n in names[r % len(names):] + names[:r % len(names)]:
            got[n].append(cases[n](r))
    print(f"\nfirst operator in a fresh environment (median of {rounds} interleaved rounds, min-max); "
          f"load average {os.getloadavg()[0]:.2f} at the end")
    stats = {n: {k: Stat([x[k] for x in got[n]]) for k in ("seconds", "compiler_cpu", "cpu")} for n in names}
    timing.table(["case", "wall", "compiler CPU", "CPU (process + compiler)"],
                 [[n, s["seconds"].fmt("s"), s["compiler_cpu"].fmt("s"), s["cpu"].fmt("s")] for n, s in stats.items()])
    ob = stats["opbuilder, installed"]
    report.goal(f"first operator after installing opbuilder <= {FIRST_WALL_GOAL_S:.1f} s wall (quiet machine; load "
                f"average {os.getloadavg()[0]:.1f})", ob["seconds"].median <= FIRST_WALL_GOAL_S,
                ob["seconds"].fmt("s"))
    if "tvm-ffi" in stats:
        r = ratio(ob["compiler_cpu"], stats["tvm-ffi"]["compiler_cpu"])
        report.goal(f"its compiler CPU <= {FIRST_CPU_GOAL}x tvm-ffi's first operator's", r.median <= FIRST_CPU_GOAL,
                    r.fmt("x"))


def shipped_load(work: Path, site: Path, rounds: int, report: Report) -> None:
    """The shipped-load row (see the module docstring)."""
    cache = work / "shipped-cache"  # made by nothing: a shipped load writes no cache
    env = _env(site, OPBUILDER_CACHE_DIR=str(cache), **NO_CXX)
    walls: Dict[str, List[float]] = {"import runtime": [], "import runtime + shipped_pkg": [], "floor": []}
    inner: List[dict] = []
    floor: List[dict] = []
    first = _json([sys.executable, "-c", SHIPPED, "pkg"], env, "shipped load", work)
    native = site / "opbuilder" / "_native"
    libs = json.dumps([str(native / "libnanobind.so"), str(native / "libobcore.so")])
    for r in range(rounds + 1):  # the first round writes bytecode caches: not counted
        names = list(walls)
        order = names[r % len(names):] + names[:r % len(names)]
        for case in order:
            t0 = time.perf_counter()
            if case == "floor":
                out = _json([sys.executable, "-c", SHIPPED_FLOOR, libs, first["lib"]], env, case, work)
            else:
                out = _json([sys.executable, "-c", SHIPPED] + (["pkg"] if "shipped" in case else []), env, case,
                            work)
            if r:
                walls[case].append(time.perf_counter() - t0)
                if "shipped" in case:
                    inner.append(out)
                elif case == "floor":
                    floor.append(out)
    pkg = Stat([x["package"] for x in inner])
    pkg_cpu = Stat([x["package_cpu"] for x in inner])
    flo, flo_cpu = Stat([x["package"] for x in floor]), Stat([x["package_cpu"] for x in floor])
    load = os.getloadavg()[0]
    rt_import = Stat([x["runtime"] for x in inner])
    delta = Stat([b - a for a, b in zip(walls["import runtime"], walls["import runtime + shipped_pkg"])])
    spawned = sorted({e for x in inner for e in x["spawned"]})
    print(f"\na shipped operator, no compiler (median of {rounds} interleaved rounds, min-max)")
    timing.table(["what", "time"], [
        ["import runtime (inside the process)", rt_import.fmt("ms")],
        ["then import shipped_pkg, which calls load() (inside the process)",
         pkg.fmt("ms") + f"; CPU {pkg_cpu.fmt('ms')}"],
        ["floor: its binary imported directly, no checks (after import runtime, inside the process)",
         flo.fmt("ms") + f"; CPU {flo_cpu.fmt('ms')}"],
        ["whole process: import runtime", Stat(walls["import runtime"]).fmt("ms")],
        ["whole process: import runtime + shipped_pkg", Stat(walls["import runtime + shipped_pkg"]).fmt("ms")],
        ["whole process, difference (round by round)", delta.fmt("ms")],
        ["child processes started by the import and load()", str(sum(len(x["spawned"]) for x in inner))]])
    report.goal(f"shipped operator: import of the package + load() <= {SHIPPED_GOAL_S * 1e3:.0f} ms over import "
                f"runtime (load average {load:.1f}; {ratio(pkg, flo).fmt('x')} its floor, CPU "
                f"{ratio(pkg_cpu, flo_cpu).fmt('x')})",
                pkg.median <= SHIPPED_GOAL_S, pkg.fmt("ms"))
    report.goal("shipped operator: 0 child processes", not spawned, ", ".join(spawned) or "0")
    if cache.exists():
        print(f"note: the shipped load made the cache directory {cache}")


def _pyenv(version: str) -> Optional[str]:
    versions = Path(os.environ.get("PYENV_ROOT", "~/.pyenv")).expanduser() / "versions"
    found = sorted(versions.glob(f"{version}.*/bin/python"))
    return str(found[-1]) if found else None


def _venv(python: str, where: Path, packages: List[str]) -> str:
    py = where / "bin" / "python"
    if not py.exists():
        print(f"  making a venv of {python} in {where} (pip: {' '.join(packages)}) ...", file=sys.stderr, flush=True)
        _run_in([python, "-m", "venv", where], _env(None), "venv", where.parent)
        _run_in([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", *packages], _env(None),
                f"pip install into {where}", where.parent)
    return str(py)


def _needed(lib: str) -> List[str]:
    """The libraries ``lib`` links (readelf -d), or ["?"] without readelf."""
    if shutil.which("readelf") is None:
        return ["?"]
    out = subprocess.run(["readelf", "-d", lib], capture_output=True, text=True).stdout
    return [ln.split("[", 1)[1].split("]", 1)[0] for ln in out.splitlines() if "(NEEDED)" in ln]


def builds_needed(work: Path, site311: Path, second_torch: Optional[str], torch_ext: bool, report: Report) -> None:
    """The builds-needed table (see the module docstring)."""
    rows: List[List[str]] = []
    not_run: List[str] = []
    py_axis: Dict[str, dict] = {}
    py312, py313 = _pyenv("3.12"), _pyenv("3.13")
    if py312 and py313:
        v312 = _venv(py312, work / "venv312", ["numpy", "nanobind", "pybind11", "ninja", "filelock", "hatchling"])
        v313 = _venv(py313, work / "venv313", ["numpy"])
        site312 = wheels(v312, work, "py312")
        for py in (v312, v313):
            py_axis[py] = _json([py, "-c", CHECK], _env(site312, OPBUILDER_CACHE_DIR=str(work / "c-py"), **NO_CXX),
                                f"the shipped op under {py}", work)
            x = py_axis[py]
            rows.append([f"Python {x['python']}, runtime (no torch)", Path(x["file"]).name, x["sha256"][:16],
                         "right" if x["ok"] else "WRONG"])
    else:
        not_run.append("the Python axis (pyenv's " + " and ".join(v for v, p in (("3.12", py312), ("3.13", py313))
                                                                   if p is None) + " missing)")
    torch_axis: List[dict] = []
    for py in [sys.executable] + ([second_torch] if second_torch else []):
        x = _json([py, "-c", CHECK, "torch"], _env(site311, OPBUILDER_CACHE_DIR=str(work / "c-torch"), **NO_CXX),
                  f"the shipped op under {py}", work)
        torch_axis.append(x)
        rows.append([f"Python {x['python']}, torch {x['torch']} (to_torch)", Path(x["file"]).name, x["sha256"][:16],
                     "right" if x["ok"] else "WRONG"])
    if not second_torch:
        not_run.append("a second torch (--second-torch PYTHON or OPBUILDER_SECOND_TORCH_PYTHON)")
    print("\nbuilds needed: the shipped operator's binary, loaded with no compiler (CXX=/bin/false, "
          "OPBUILDER_NO_BUILD=1)")
    timing.table(["process", "binary", "SHA-256 (first 16)", "values and gradients"], rows)
    op_libs = [x["file"] for x in list(py_axis.values()) + torch_axis]
    print(f"the operator binary links: {', '.join(sorted(set(_needed(op_libs[0])))) or '-'} (no libtorch)")
    if torch_ext:
        _torch_extension(work, second_torch)
    py_one = len({x["sha256"] for x in py_axis.values()}) == 1 and len(py_axis) == 2 and \
        Path(next(iter(py_axis.values()))["file"]).name.endswith(".abi3.so")
    torch_one = len({x["sha256"] for x in torch_axis}) == 1 and len({x["torch"] for x in torch_axis}) == 2
    all_ok = all(x["ok"] for x in list(py_axis.values()) + torch_axis)
    shown = [a for a, ok in (("Python 3.12 = 3.13 (one abi3 file)", py_one),
                             ("torch " + " = ".join(x["torch"] for x in torch_axis) + " (one file)", torch_one)) if ok]
    print("shown: " + ("; ".join(shown) or "nothing") + ("; not run: " + "; ".join(not_run) if not_run else ""))
    report.goal("builds needed for Python 3.12, 3.13 x torch 2.13, 2.14: 1 operator binary (torch's cpp_extension: 4)",
                py_one and torch_one and all_ok,
                "1" if py_one and torch_one and all_ok else "not shown: " + "; ".join(not_run or ["a check failed"]))


def _torch_extension(work: Path, second_torch: Optional[str]) -> None:
    """torch's side: the cpp_extension build of the same kind of operator, what it links, and whether the
    second torch imports it."""
    code = ("import sys, torch\nfrom torch.utils import cpp_extension\n"
            "m = cpp_extension.load('torch_mul_ext', [sys.argv[1]], build_directory=sys.argv[2], verbose=False)\n"
            "print(m.__file__)")
    build = work / "torch-ext"
    build.mkdir(exist_ok=True)
    print("  torch: building benchmarks/torch_mul_op.cpp with cpp_extension (unmeasured, ~35 s) ...",
          file=sys.stderr, flush=True)
    try:
        lib = _run_in([sys.executable, "-c", code, TORCH_EXT_SOURCE, build], _env(None, TORCH_EXTENSIONS_DIR=str(build)),
                      "cpp_extension.load", work).stdout.strip().splitlines()[-1]
    except Unmeasured as e:
        print(f"torch's cpp_extension build failed: {e}")
        return
    links = [n for n in _needed(lib) if "torch" in n or "c10" in n]
    print(f"torch's cpp_extension binary {Path(lib).name}: links {', '.join(links)}; one per Python version (a "
          f"cpython-3XX module, the full API) and per torch version (libtorch's C++ ABI): 2 x 2 = 4 builds")
    if second_torch:
        load = ("import sys, torch, importlib.util\n"
                "spec = importlib.util.spec_from_file_location('torch_mul_ext', sys.argv[1])\n"
                "m = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(m)\n"
                "print('loads; mul:', m.mul(torch.ones(2), torch.ones(2)).tolist())")
        res = subprocess.run([second_torch, "-c", load, lib], capture_output=True, text=True, env=_env(None))
        msg = (res.stdout.strip() or res.stderr.strip().splitlines()[-1] if res.stderr.strip() else "").strip()
        print(f"the same torch extension under the second torch: {msg[:300]}")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the first-operator row")
    ap.add_argument("--load-rounds", type=int, default=15, help="interleaved rounds of the shipped-load row")
    ap.add_argument("--rows", default="first,shipped,builds", help="which rows, comma-separated")
    ap.add_argument("--work", type=Path, help="keep the wheels and venvs here, reused by the next run")
    ap.add_argument("--second-torch", default=os.environ.get("OPBUILDER_SECOND_TORCH_PYTHON"),
                    help="a Python of this version with another torch (default: OPBUILDER_SECOND_TORCH_PYTHON)")
    ap.add_argument("--no-torch-ext", action="store_true", help="skip torch's cpp_extension build (~35 s)")
    ap.add_argument("--threads", type=int, default=1, help="BLAS/OpenMP threads of every side (timing.py)")
    args = ap.parse_args(argv)
    rows = set(args.rows.split(","))
    timing.header("ship: the first operator, a shipped operator's load, builds needed", None)
    report = Report()
    work = args.work or Path(tempfile.mkdtemp(prefix="opbuilder-ship-"))
    work.mkdir(parents=True, exist_ok=True)
    run = work / f"run-{os.getpid()}"  # fresh caches of this run
    run.mkdir()
    try:
        site = wheels(sys.executable, work, f"py{sys.version_info[0]}{sys.version_info[1]}")
        for name, fn in (("first", lambda: first_operator(run, site, args.rounds, report)),
                         ("shipped", lambda: shipped_load(run, site, args.load_rounds, report)),
                         ("builds", lambda: builds_needed(work, site, args.second_torch, not args.no_torch_ext, report))):
            if name in rows:
                try:
                    fn()
                except Unmeasured as e:
                    report.fail(name, e)
    except Unmeasured as e:
        report.fail("the wheels", e)
    finally:
        shutil.rmtree(run, ignore_errors=True)
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
