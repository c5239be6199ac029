"""Instructions of a shipped load and of warm loads, each in a new process (callgrind: deterministic, so it
tells changes apart on a loaded machine where wall time cannot).

    python benchmarks/load_instructions.py --work DIR [--cache DIR]

``--work``: the directory ``ship.py --work DIR`` filled (opbuilder's and examples/shipped_pkg's wheels
installed into ``DIR/py3XX/site``). ``--cache``: a cache for the warm rows (default: a new one; the
first run builds the README operator and an inline one there, a minute or more).

Each figure is a process's instructions less those of the same process without the step, with
``PYTHONHASHSEED=0``, one BLAS thread, bytecode written (a first run, not counted, writes it), and a
directory of its own as the working directory (a script's directory is searched by every import):

- shipped ``load()``: ``import runtime; import shipped_pkg`` (which calls ``CustomOpBuilder(...).load()``)
  less ``import runtime``, with ``CXX=/bin/false OPBUILDER_NO_BUILD=1``; its floor: the installed runtime's
  two libraries and the binary loaded with ``ctypes`` and ``ExtensionFileLoader``, no checks;
- warm ``load()`` and ``load_inline``: ``import numpy; import opbuilder; <load>`` less the imports;
  the floor: the cached library and the libraries it loads first, imported directly.

Needs valgrind. Goals are wall-time goals (ship.py, load_and_call.py); this prints no verdict.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing  # noqa: E402
from load_and_call import INLINE, SOURCE  # noqa: E402

LOADS = r"""
import sys
what = sys.argv[1]
if what.startswith("shipped"):
    import runtime
    if what == "shipped":
        import shipped_pkg
    elif what == "shipped floor":
        import ctypes, importlib.machinery, importlib.util
        libs, path = sys.argv[2:-1], sys.argv[-1]
        for lib in libs:
            ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
        loader = importlib.machinery.ExtensionFileLoader("shipped_ops", path)
        loader.exec_module(importlib.util.module_from_spec(importlib.machinery.ModuleSpec("shipped_ops", loader,
                                                                                         origin=path)))
else:
    import json, numpy
    import opbuilder
    if what == "load()":
        m = opbuilder.CustomOpBuilder("my_ops", [sys.argv[2]]).load()
    elif what == "load_inline":
        m = opbuilder.load_inline("warm_inline", sys.argv[2], functions=["add_one"])
    elif what == "warm floor":
        import ctypes, importlib.machinery, importlib.util
        libs, path, name = json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
        for lib in libs:
            ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
        loader = importlib.machinery.ExtensionFileLoader(name, path)
        loader.exec_module(importlib.util.module_from_spec(importlib.machinery.ModuleSpec(name, loader, origin=path)))
    if what in ("load()", "load_inline"):
        print(json.dumps({"lib": m.__file__}))
"""


def _env(**extra: str) -> Dict[str, str]:
    env = {k: v for k, v in timing.child_env().items() if not k.startswith("OPBUILDER_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(PYTHONHASHSEED="0", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", **extra)
    return env


def _instructions(args: List[str], env: Dict[str, str], cwd: Path) -> int:
    """The instructions of ``python -c LOADS *args`` (after one run that writes bytecode and records)."""
    cmd = [sys.executable, "-c", LOADS, *args]
    subprocess.run(cmd, env=env, cwd=cwd, check=True, capture_output=True, timeout=600)
    out = cwd / "callgrind.out"
    res = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *cmd], env=env, cwd=cwd,
                         capture_output=True, text=True, timeout=1200)
    if res.returncode != 0:
        raise SystemExit(f"{args[0]}: exited {res.returncode}: {res.stderr.strip().splitlines()[-1:]}")
    m = re.search(r"^summary: (\d+)$", out.read_text(errors="replace"), re.M)
    out.unlink()
    if m is None:
        raise SystemExit(f"{args[0]}: callgrind wrote no summary")
    return int(m.group(1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, help="ship.py's --work directory (the shipped rows need it)")
    ap.add_argument("--cache", type=Path, help="the warm rows' cache (default: a new one)")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        print("valgrind is not installed: nothing measured")
        return 1
    rows: List[List[str]] = []
    with tempfile.TemporaryDirectory(prefix="opbuilder-instr-") as tmp:
        cwd = Path(tmp)
        site = args.work / f"py{sys.version_info[0]}{sys.version_info[1]}" / "site" if args.work else None
        if site is not None and site.is_dir():
            env = _env(PYTHONPATH=str(site), OPBUILDER_CACHE_DIR=str(cwd / "no-cache"), CXX="/bin/false",
                       CC="/bin/false", OPBUILDER_NO_BUILD="1")
            native = site / "opbuilder" / "_native"
            (lib,) = (site / "shipped_pkg" / "_opbuilder").glob("shipped_ops*.so")
            base = _instructions(["shipped base"], env, cwd)
            got = _instructions(["shipped"], env, cwd) - base
            floor = _instructions(["shipped floor", str(native / "libnanobind.so"), str(native / "libobcore.so"),
                                   str(lib)], env, cwd) - base
            rows += [["shipped `load()` with the package's import", f"{got / 1e6:.2f} M", f"{floor / 1e6:.2f} M",
                      f"{got / floor:.1f}x"]]
        else:
            print("no --work directory of ship.py: the shipped rows are skipped")
        cache = args.cache or cwd / "cache"
        env = _env(PYTHONPATH=str(timing.ROOT), OPBUILDER_CACHE_DIR=str(cache))
        libs = {}
        for what, arg in (("load()", str(SOURCE)), ("load_inline", INLINE)):  # built if needed, records written
            for _ in range(2):
                res = subprocess.run([sys.executable, "-c", LOADS, what, arg], env=env, cwd=cwd, check=True,
                                     capture_output=True, text=True, timeout=1800)
            libs[what] = json.loads(res.stdout.strip().splitlines()[-1])["lib"]
        sys.path.insert(0, str(timing.ROOT))
        os.environ["OPBUILDER_CACHE_DIR"] = str(cache)
        from opbuilder import CustomOpBuilder
        b = CustomOpBuilder("my_ops", [str(SOURCE)])
        deps = json.dumps([d for d in (b.runtime_library(), b.core_library()) if d])
        base = _instructions(["warm base"], env, cwd)
        for what, arg, name in (("load()", str(SOURCE), "my_ops"), ("load_inline", INLINE, "warm_inline")):
            got = _instructions([what, arg], env, cwd) - base
            floor = _instructions(["warm floor", deps, libs[what], name], env, cwd) - base
            rows.append([f"warm `{what}`", f"{got / 1e6:.2f} M", f"{floor / 1e6:.2f} M", f"{got / floor:.1f}x"])
    print(f"\ninstructions in a new process, over its imports (callgrind; load average {os.getloadavg()[0]:.1f}, "
          f"which does not change them)")
    timing.table(["load", "instructions", "floor: imported directly", "ratio"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
