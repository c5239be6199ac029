"""What a new process pays to start using the runtime.

    python benchmarks/import_time.py [--rounds 9]   # about 20 s once the example operator is built

Rows, each a whole new process (``python -c ...``), timed in interleaved rounds (A B A B ..., the order
rotated each round, benchmarks/timing.py), medians with min-max, ratios taken round by round:
  * ``import numpy`` against ``import runtime`` (the runtime imports numpy itself);
  * warm: ``import runtime`` + the README operator's warm ``load()`` + one call, against its floor: python +
    ``import numpy`` + importing a bare C extension and calling it once (what any operator must cost).

The operator is built once (untimed) in a temporary cache before the rounds; the bare extension is compiled
with the C compiler directly. See ``python -X importtime -c "import runtime"`` for what is imported.

Goals: ``import runtime`` <= 1.2x ``import numpy`` (issue 38, goal 7; issue 24 asked 1.3x); the warm process
<= 1.2x its floor. Each goal line carries the load average at its end; the CPU time (user + system) of
each process is shown beside its wall time: on a loaded machine the wall time waits for a core.
A child process that fails, or a missing source or compiler, prints FAIL and the exit status is 1.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing  # noqa: E402  (first: pins the thread count before numpy and torch load)
from timing import Report, Stat, ratio  # noqa: E402

SOURCE = timing.ROOT / "custom_src" / "function_ops.cpp"
WARM_CHILD = ("import sys, runtime\nfrom opbuilder import CustomOpBuilder\n"
              "m = CustomOpBuilder('my_ops', [sys.argv[1]]).load()\n"
              "assert m.mul(runtime.Tensor(2.0), runtime.Tensor(3.0)).item() == 6.0\n")
FLOOR_CHILD = "import numpy, bare\nassert bare.f(1) == 2\n"
BARE_C = """#define PY_SSIZE_T_CLEAN
#include <Python.h>
static PyObject *f(PyObject *self, PyObject *arg) {
  (void)self;
  return PyLong_FromLong(PyLong_AsLong(arg) + 1);
}
static PyMethodDef methods[] = {{"f", f, METH_O, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "bare", NULL, -1, methods, NULL, NULL, NULL, NULL};
PyMODINIT_FUNC PyInit_bare(void) { return PyModule_Create(&def); }
"""


def _bare_extension(work: Path) -> Path:
    """Compiles the bare C extension into ``work``; returns the directory to put on PYTHONPATH."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise timing.Unmeasured("no C compiler (cc/gcc) on PATH")
    src = work / "bare.c"
    src.write_text(BARE_C)
    out = work / ("bare" + sysconfig.get_config_var("EXT_SUFFIX"))
    cmd = [cc, "-O2", "-shared", "-fPIC", "-I", sysconfig.get_paths()["include"], str(src), "-o", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise timing.Unmeasured(f"compiling the bare extension failed: {res.stderr.strip()[-200:]}")
    return work


_CPU: Dict[str, List[float]] = {}  # case -> CPU seconds (user + system) of each timed process


def _process(code: str, args: List[str], env: Dict[str, str]) -> Tuple[float, float]:
    """(wall seconds, CPU seconds) of one whole child process running ``code``."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code, *args], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode != 0:
        tail = err.strip().splitlines()[-1:] or ["(no output)"]
        raise timing.Unmeasured(f"a child process exited {proc.returncode}: {tail[0]}")
    return wall, usage.ru_utime + usage.ru_stime


def _rounds(cases: Dict[str, tuple], rounds: int) -> Dict[str, Stat]:
    """Each case (code, args, env) once per round, the order rotated each round, after one untimed run of
    each (it writes bytecode caches). Wall times; the CPU times go to ``_CPU``."""
    names = list(cases)
    for name in names:
        _process(*cases[name])
    samples: Dict[str, List[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            wall, cpu = _process(*cases[name])
            samples[name].append(wall)
            _CPU.setdefault(name, []).append(cpu)
    return {n: Stat(s) for n, s in samples.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9, help="interleaved rounds (one process per case each)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    report = Report()
    timing.header("new-process cost: import runtime, warm load() and one call", args.rounds)
    env = timing.child_env()
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # a real user's imports use .pyc files
    try:
        imports = _rounds({"numpy": ("import numpy", [], env), "runtime": ("import runtime", [], env)},
                          args.rounds)
    except timing.Unmeasured as e:
        report.fail("import rows", e)
        imports = None
    warm = None
    with tempfile.TemporaryDirectory(prefix="opbuilder-import-") as tmp:
        try:
            if not SOURCE.exists():
                raise timing.Unmeasured(f"missing {SOURCE}")
            bare_dir = _bare_extension(Path(tmp))
            op_env = dict(env, OPBUILDER_CACHE_DIR=os.path.join(tmp, "cache"))
            floor_env = dict(env, PYTHONPATH=os.pathsep.join([str(bare_dir), env["PYTHONPATH"]]))
            print("building the example operator (untimed) ...", file=sys.stderr, flush=True)
            _process(WARM_CHILD, [str(SOURCE)], op_env)
            warm = _rounds({"floor": (FLOOR_CHILD, [], floor_env), "warm": (WARM_CHILD, [str(SOURCE)], op_env)},
                           args.rounds)
        except timing.Unmeasured as e:
            report.fail("warm-process rows", e)
    cpu = {n: Stat(s) for n, s in _CPU.items()}
    rows = []
    if imports:
        rows += [["`import numpy`", imports["numpy"].fmt("ms"), cpu["numpy"].fmt("ms"), ""],
                 ["`import runtime`", imports["runtime"].fmt("ms"), cpu["runtime"].fmt("ms"),
                  f'{ratio(imports["runtime"], imports["numpy"]).fmt("x")}; CPU '
                  f'{ratio(cpu["runtime"], cpu["numpy"]).fmt("x")}']]
    if warm:
        rows += [["floor: numpy + bare extension, one call", warm["floor"].fmt("ms"), cpu["floor"].fmt("ms"), ""],
                 ["import runtime + warm load() + one call", warm["warm"].fmt("ms"), cpu["warm"].fmt("ms"),
                  f'{ratio(warm["warm"], warm["floor"]).fmt("x")}; CPU {ratio(cpu["warm"], cpu["floor"]).fmt("x")}']]
    timing.table(["whole new process", "wall", "CPU (user + system)", "ratio, round by round"], rows)
    print()
    load = os.getloadavg()[0]
    if imports:
        r = ratio(imports["runtime"], imports["numpy"])
        report.goal(f"import runtime <= 1.2x import numpy (whole process, wall; load average {load:.1f})",
                    r.median <= 1.2, r.fmt("x"))
    if warm:
        r = ratio(warm["warm"], warm["floor"])
        report.goal(f"warm process (import, load(), one call) <= 1.2x its floor (wall; load average {load:.1f})",
                    r.median <= 1.2, r.fmt("x"))
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
