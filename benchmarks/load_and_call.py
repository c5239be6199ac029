"""The example operator end to end: build it, load it in new processes, call it.

    python benchmarks/load_and_call.py [--rounds 9] [--call-rounds 7] [--no-torch]   # ~1 minute after the builds

Prints, for custom_src/function_ops.cpp's ``mul`` and a one-function ``load_inline`` operator:
  * cold build: ``load()`` in a new process on an empty cache directory (one sample);
  * warm, in new processes (interleaved rounds, medians with min-max, load average beside each goal):
      - ``CustomOpBuilder(...).load()`` and ``load_inline(...)``, the call itself (wall, and the thread's
        CPU time), next to its floor: the same library imported directly (its shared libraries loaded
        first, then ``ExtensionFileLoader``), what any loader of it must do;
      - the whole process ``import numpy; import opbuilder; load; first call`` against tvm-ffi's
        ``import numpy; import tvm_ffi.cpp; load_inline; first call`` on the same operator (package
        apache-tvm-ffi; skipped, saying so, when absent), each over the ``import numpy`` process: tvm-ffi
        imports torch whenever torch is installed, so its row is run with torch hidden (its leanest
        start) and, for reference, as installed;
      - ``opbuilder.to_torch(module)`` after ``import torch`` (with --no-torch, or without torch, skipped);
  * per-call time on 1-element and 1M-element float32 tensors (no grad) next to ``numpy.multiply``.

Goals (issue 38, goal 5): warm load() <= 2 ms and warm load_inline <= 3 ms in a new process (with their
ratio to the floor shown); import opbuilder + load + first call no slower than tvm-ffi's, over the same
import numpy floor (round by round); the 1M-element call within 1.1x of numpy.multiply.
Flags: both operators build with opbuilder's defaults (-O2, its PCH when present); tvm-ffi with its own.
A child process that fails, or a missing source, prints FAIL and the exit status is 1.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing  # noqa: E402  (first: pins the thread count before numpy and torch load)
from timing import Report, Stat, interleaved, ratio  # noqa: E402

import numpy as np  # noqa: E402

SOURCE = timing.ROOT / "custom_src" / "function_ops.cpp"
INLINE = ("using namespace opbuilder;\nTensorPtr add_one(const TensorPtr &x) {\n  auto y = Tensor::empty_like(x);\n"
          "  const float *a = x->data<float>();\n  float *o = y->data<float>();\n"
          "  for (int64_t i = 0; i < x->numel(); ++i) o[i] = a[i] + 1;\n  return y;\n}\n")
TVM_INLINE = ("void add_one(tvm::ffi::TensorView x, tvm::ffi::TensorView y) {\n"
              "  const float *a = static_cast<float *>(x.data_ptr());\n  float *o = static_cast<float *>(y.data_ptr());\n"
              "  for (int64_t i = 0; i < x.size(0); ++i) o[i] = a[i] + 1;\n}\n")
LOAD_GOAL_S, INLINE_GOAL_S = 0.002, 0.003

# a new process: the warm load (argv[1]: "builder" or "inline"), timed inside; prints the figures as JSON
CHILD = r"""
import json, sys, time
t0, c0 = time.perf_counter(), time.thread_time()
import numpy as np
t1, c1 = time.perf_counter(), time.thread_time()
import opbuilder
t2, c2 = time.perf_counter(), time.thread_time()
if sys.argv[1] == "builder":
    m = opbuilder.CustomOpBuilder("my_ops", [sys.argv[2]]).load()
else:
    m = opbuilder.load_inline("warm_inline", sys.argv[2], functions=["add_one"])
t3, c3 = time.perf_counter(), time.thread_time()
x = np.ones(3, dtype=np.float32)
out = m.mul(x, x) if sys.argv[1] == "builder" else m.add_one(x)
t4, c4 = time.perf_counter(), time.thread_time()
assert out.asnumpy().tolist() == ([1.0] * 3 if sys.argv[1] == "builder" else [2.0] * 3)
print(json.dumps({"import": t2 - t1, "load": t3 - t2, "call": t4 - t3, "load_cpu": c3 - c2,
                  "after_numpy": t4 - t1, "lib": m.__file__}))
"""
# the floor of a warm load: the same library imported directly, its shared libraries loaded first
FLOOR = r"""
import ctypes, importlib.machinery, importlib.util, json, sys, time
import numpy as np
import opbuilder
libs, path, name = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
t0, c0 = time.perf_counter(), time.thread_time()
for lib in libs:
    ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
loader = importlib.machinery.ExtensionFileLoader(name, path)
spec = importlib.machinery.ModuleSpec(name, loader, origin=path)
m = importlib.util.module_from_spec(spec)
loader.exec_module(m)
t1, c1 = time.perf_counter(), time.thread_time()
print(json.dumps({"load": t1 - t0, "load_cpu": c1 - c0}))
"""
TVM = r"""
import json, sys, time
if sys.argv[2] == "hide-torch":
    sys.modules["torch"] = None  # tvm_ffi imports torch whenever it can: its start without it
t1 = time.perf_counter()
import numpy as np
t1 = time.perf_counter()
import tvm_ffi.cpp
m = tvm_ffi.cpp.load_inline("warm_tvm", cpp_sources=sys.argv[3], functions=["add_one"], build_directory=sys.argv[1])
x = np.ones(3, dtype=np.float32)
y = np.empty_like(x)
m.add_one(x, y)
t2 = time.perf_counter()
assert y.tolist() == [2.0] * 3
print(json.dumps({"after_numpy": t2 - t1}))
"""
NUMPY = "import numpy"
TO_TORCH = r"""
import json, sys, time
import torch
import opbuilder
m = opbuilder.CustomOpBuilder("my_ops", [sys.argv[1]]).load()
t0 = time.perf_counter()
ops = opbuilder.to_torch(m)
t1 = time.perf_counter()
assert ops.mul(torch.ones(3), torch.ones(3)).tolist() == [1.0] * 3
print(json.dumps({"to_torch": t1 - t0}))
"""


def _env(**extra: str) -> Dict[str, str]:
    env = timing.child_env(**extra)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # a real user's imports use .pyc files
    return env


def _json(args: List[str], env: Dict[str, str], what: str) -> dict:
    res = timing.run_child([sys.executable, *args], env=env, what=what)
    return json.loads(res.stdout.strip().splitlines()[-1])


def _process(args: List[str], env: Dict[str, str], what: str) -> float:
    t0 = time.perf_counter()
    timing.run_child([sys.executable, *args], env=env, what=what)
    return time.perf_counter() - t0


def _tvm_available() -> bool:
    import importlib.util
    return importlib.util.find_spec("tvm_ffi") is not None


def warm_rows(cache: str, work: Path, rounds: int, use_torch: bool, report: Report) -> None:
    """The new-process rows and goals (see the module docstring)."""
    env = _env(OPBUILDER_CACHE_DIR=cache)
    print("building the operators on an empty cache ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    first = _json(["-c", CHILD, "builder", str(SOURCE)], env, "the cold load()")
    cold = time.perf_counter() - t0
    inline_first = _json(["-c", CHILD, "inline", INLINE], env, "the cold load_inline")
    time.sleep(0.3)  # the new files settle before the warm records are written (warm.py)
    for kind, code in (("builder", str(SOURCE)), ("inline", INLINE)):  # unmeasured: records and bytecode
        _json(["-c", CHILD, kind, code], env, f"the warm {kind}")
    from opbuilder import CustomOpBuilder
    os.environ["OPBUILDER_CACHE_DIR"] = cache
    libs = [d for d in (CustomOpBuilder("my_ops", [str(SOURCE)]).runtime_library(),
                        CustomOpBuilder("my_ops", [str(SOURCE)]).core_library()) if d]
    cases = {
        "load()": lambda: _json(["-c", CHILD, "builder", str(SOURCE)], env, "warm load()"),
        "load() floor": lambda: _json(["-c", FLOOR, json.dumps(libs), first["lib"], "my_ops"], env, "load() floor"),
        "load_inline": lambda: _json(["-c", CHILD, "inline", INLINE], env, "warm load_inline"),
        "load_inline floor": lambda: _json(["-c", FLOOR, json.dumps(libs), inline_first["lib"], "warm_inline"], env,
                                           "load_inline floor"),
        "import numpy": lambda: {"process": _process(["-c", NUMPY], env, "import numpy")},
    }
    tvm = _tvm_available()
    if tvm:
        tvm_dir = str(work / "tvm")
        for mode in ("hide-torch", "as-installed"):
            _json(["-c", TVM, tvm_dir, mode, TVM_INLINE], env, "tvm-ffi build")  # builds once, then warm
        cases["tvm-ffi"] = lambda: _json(["-c", TVM, tvm_dir, "hide-torch", TVM_INLINE], env, "tvm-ffi")
        cases["tvm-ffi, torch importable"] = lambda: _json(["-c", TVM, tvm_dir, "as-installed", TVM_INLINE], env,
                                                           "tvm-ffi with torch")
    else:
        print("apache-tvm-ffi is not installed (pip install apache-tvm-ffi): its rows and goal are skipped")
    got: Dict[str, List[dict]] = {n: [] for n in cases}
    names = list(cases)
    for r in range(rounds):
        print(f"  warm rows: round {r + 1}/{rounds} ...", file=sys.stderr, flush=True)
        for n in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            out = cases[n]()
            out.setdefault("process", time.perf_counter() - t0)
            got[n].append(out)
    load = os.getloadavg()[0]

    def st(case: str, key: str) -> Stat:
        return Stat([x[key] for x in got[case]])

    print(f"\ncold build (empty cache, load() in a new process, one sample)  {cold:.2f} s")
    print(f"\nwarm, each in a new process (median of {rounds} interleaved rounds, min-max; load average {load:.2f})")
    rows = [["`CustomOpBuilder(...).load()`", st("load()", "load").fmt("ms"), st("load()", "load_cpu").fmt("ms"),
             st("load() floor", "load").fmt("ms"), ratio(st("load()", "load"), st("load() floor", "load")).fmt("x")],
            ["`load_inline(...)`", st("load_inline", "load").fmt("ms"), st("load_inline", "load_cpu").fmt("ms"),
             st("load_inline floor", "load").fmt("ms"),
             ratio(st("load_inline", "load"), st("load_inline floor", "load")).fmt("x")]]
    timing.table(["warm call, inside the process", "wall", "CPU (thread)", "floor: import the library directly",
                  "ratio to floor"], rows)
    print()
    rows = [["`import opbuilder`", st("load()", "import").fmt("ms")],
            ["first call of `mul` (numpy in, runtime tensor out)", st("load()", "call").fmt("ms")],
            ["`import opbuilder` + load() + first call, after `import numpy`", st("load()", "after_numpy").fmt("ms")],
            ["`import opbuilder` + load_inline + first call, after `import numpy`",
             st("load_inline", "after_numpy").fmt("ms")]]
    if tvm:
        rows += [["tvm-ffi: `import tvm_ffi.cpp` + load_inline + first call, after `import numpy` (torch hidden)",
                  st("tvm-ffi", "after_numpy").fmt("ms")],
                 ["tvm-ffi, the same with torch importable (it imports torch)",
                  st("tvm-ffi, torch importable", "after_numpy").fmt("ms")]]
    rows += [["whole process: `import numpy` (the floor)", st("import numpy", "process").fmt("ms")],
             ["whole process: numpy + opbuilder + load() + first call", st("load()", "process").fmt("ms")]]
    if tvm:
        rows += [["whole process: numpy + tvm-ffi + load_inline + first call (torch hidden)",
                  st("tvm-ffi", "process").fmt("ms")]]
    timing.table(["new process", "wall"], rows)
    if use_torch:
        try:
            tt = [_json(["-c", TO_TORCH, str(SOURCE)], env, "to_torch") for _ in range(3)]
            print(f"\n`opbuilder.to_torch(module)` after `import torch`, new process (3 samples): "
                  f"{Stat([x['to_torch'] for x in tt]).fmt('ms')}")
        except timing.Unmeasured as e:
            report.fail("to_torch row", e)
    print()
    lw, iw = st("load()", "load"), st("load_inline", "load")
    report.goal(f"warm load() in a new process <= {LOAD_GOAL_S * 1e3:.0f} ms (load average {load:.1f}; "
                f"{ratio(lw, st('load() floor', 'load')).median:.2f}x its floor)", lw.median <= LOAD_GOAL_S,
                lw.fmt("ms"))
    report.goal(f"warm load_inline in a new process <= {INLINE_GOAL_S * 1e3:.0f} ms (load average {load:.1f}; "
                f"{ratio(iw, st('load_inline floor', 'load')).median:.2f}x its floor)", iw.median <= INLINE_GOAL_S,
                iw.fmt("ms"))
    if tvm:  # each timed inside its process after its own `import numpy`: the floor both stand on
        for case in ("load()", "load_inline"):
            over, peer = st(case, "after_numpy"), st("tvm-ffi", "after_numpy")
            r = ratio(over, peer)
            report.goal(f"import opbuilder + {case} + first call, over import numpy: no slower than tvm-ffi's "
                        f"(torch hidden), round by round (load average {load:.1f})", r.median <= 1.0,
                        f"{r.fmt('x')}; {over.fmt('ms')} against {peer.fmt('ms')}")


def call_rows(cache: str, rounds: int, report: Report) -> None:
    os.environ["OPBUILDER_CACHE_DIR"] = cache
    import runtime as rt
    from opbuilder import CustomOpBuilder
    m = CustomOpBuilder("my_ops", [str(SOURCE)]).load()
    rows = []
    for n, calls in ((1, 20_000), (1 << 20, 50)):
        a = np.random.default_rng(0).standard_normal(n).astype(np.float32)
        b = np.random.default_rng(1).standard_normal(n).astype(np.float32)
        x, y = rt.Tensor(a), rt.Tensor(b)
        assert np.array_equal(m.mul(x, y).asnumpy(), a * b)
        t = interleaved({"op": lambda: m.mul(x, y), "np": lambda: np.multiply(a, b)}, calls, rounds)
        rows.append((n, t["op"], t["np"]))
    print()
    timing.table(["per call, float32, no grad", "custom mul", "numpy.multiply", "mul / numpy"],
                 [[f"{n} element{'s' if n > 1 else ''}", op.fmt("us"), npy.fmt("us"), ratio(op, npy).fmt("x")]
                  for n, op, npy in rows])
    r = ratio(rows[1][1], rows[1][2])
    report.goal(f"1M elements: custom mul within 1.1x of numpy.multiply (same work; load average "
                f"{os.getloadavg()[0]:.1f})", r.median <= 1.1, r.fmt("x"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9, help="interleaved rounds of the new-process rows")
    ap.add_argument("--call-rounds", type=int, default=7, help="interleaved rounds of the per-call rows")
    ap.add_argument("--no-torch", action="store_true", help="skip the to_torch() row")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    report = Report()
    timing.header(f"{SOURCE.relative_to(timing.ROOT)} mul: build, load, call", args.rounds)
    if not SOURCE.exists():
        report.fail("every row", f"missing {SOURCE}")
        return report.finish()
    import importlib.util
    use_torch = not args.no_torch and importlib.util.find_spec("torch") is not None
    with tempfile.TemporaryDirectory(prefix="opbuilder-bench-") as tmp:
        cache = os.path.join(tmp, "cache")
        try:
            warm_rows(cache, Path(tmp), args.rounds, use_torch, report)
        except timing.Unmeasured as e:
            report.fail("build and load rows", e)
        call_rows(cache, args.call_rounds, report)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
