"""Instructions per 1-element call (valgrind's callgrind), for goals wall time cannot settle on a busy machine.

    python benchmarks/call_instructions.py [--calls 2000] [case ...]

Each case runs in its own process (all at once: counts do not depend on load) under ``valgrind
--tool=callgrind --instr-atstart=no``; the process warms the call up, switches counting on
(``callgrind_control -i on``), makes ``--calls`` calls, and switches it off. A ``noop`` case (a
Python lambda returning None) is counted the same way and subtracted, so a figure is the call's own
instructions. The callgrind files stay in the printed
folder: ``callgrind_annotate --inclusive=yes <file>`` says where each call's instructions go.

Cases (benchmarks/interop.py's operators, the same kernel everywhere): ``to_torch`` (the op through
to_torch's C++ bridge), ``torch_plain`` (torch's plain C++ op, pybind11), ``direct_torch`` and
``direct_numpy`` (the op itself, nanobind build, on torch tensors and on numpy arrays; as by default,
``direct_torch``'s first call loads to_torch's C++ bridge from the cache, built first if it has none,
and its C++ reads the torch tensors, dlpack_exchange.h), ``direct_torch_exchange`` (the same with the
bridge off, OPBUILDER_TORCH_BRIDGE=0: read through torch's DLPack C exchange table after its
``is_neg``), ``runtime_eager`` and ``runtime_record``
(the op on runtime.Tensors: no grad, and one requiring grad, so each call records a node; issue 33's
per-call rows of the runtime's own route), and with JAX installed ``jax_ffi`` and ``jax_ffi_grad``
(the op through to_jax's default route, XLA FFI, under ``jax.jit``: forward, and the gradient of
``mul(a, b).sum()``) against ``jnp`` and ``jnp_grad`` (``a * b`` the same ways; XLA on one thread).
Ratios printed: issue 38 goal 3 (to_torch / torch_plain, goal 1.15x), goal 2 (direct_torch /
direct_numpy, goal 1.3x; the bridge-off figure beside it) and goal 1's 1-element rows (jax_ffi / jnp,
goal 1.3x; the gradient's too). Needs valgrind and torch.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CASES = ("noop", "to_torch", "torch_plain", "direct_torch", "direct_numpy", "direct_torch_exchange", "runtime_eager",
         "runtime_record", "jax_ffi", "jnp", "jax_ffi_grad", "jnp_grad")
JAX_CASES = ("jax_ffi", "jnp", "jax_ffi_grad", "jnp_grad")

CHILD = r"""
import os, subprocess, sys
sys.path.insert(0, {here!r})
import timing  # noqa: F401  (pins threads before numpy and torch)
import numpy as np
import torch
import opbuilder
from opbuilder.bridges import torch_bridge
from torch.utils.cpp_extension import load
here = timing.HERE
case, calls = sys.argv[1], int(sys.argv[2])
obn = opbuilder.CustomOpBuilder("bench_mul_nb", [str(here / "opbuilder_mul_nb.cpp")], cflags=["-O3"]).load()
tx, ty = torch.full((1,), 2.0), torch.full((1,), 3.0)
na, nb = tx.numpy().copy(), ty.numpy().copy()
if case == "to_torch":
    wrapped = opbuilder.to_torch(obn)
    torch_bridge.ready(wait=True)
    f = lambda: wrapped.mul(tx, ty)
elif case == "torch_plain":
    tp = load("bench_torch_plain_mul", [str(here / "torch_plain_mul.cpp")], extra_cflags=["-O3"],
              extra_include_paths=[str(here)], verbose=False)
    f = lambda: tp.mul(tx, ty)
elif case == "direct_torch":  # the default: the first call loads to_torch's C++ bridge from the cache
    f = lambda: obn.mul(tx, ty)
    f()
    if torch_bridge._lookup is not None:
        torch_bridge._lookup.join()
    if torch_bridge.loaded() is None:
        raise SystemExit("direct_torch: the first call did not load the bridge: " + torch_bridge.status())
elif case == "direct_torch_exchange":  # the bridge off: torch's DLPack C exchange table, after its is_neg
    os.environ[torch_bridge.ENV] = "0"
    f = lambda: obn.mul(tx, ty)
elif case == "direct_numpy":
    f = lambda: obn.mul(na, nb)
elif case in ("runtime_eager", "runtime_record"):  # runtime.Tensors: no grad, and recording a node
    import runtime as rt
    rx, ry = rt.Tensor(na.copy(), requires_grad=case == "runtime_record"), rt.Tensor(nb.copy())
    f = lambda: obn.mul(rx, ry)
elif case in ("jax_ffi", "jnp", "jax_ffi_grad", "jnp_grad"):  # under jax.jit, XLA on one thread
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    import jax
    import jax.numpy as jnp
    mul = (lambda a, b: a * b) if case.startswith("jnp") else opbuilder.to_jax(obn).mul
    jit = jax.jit(jax.grad(lambda a, b: mul(a, b).sum(), argnums=(0, 1)) if case.endswith("_grad") else mul)
    ja, jb = jnp.full((1,), 2.0, jnp.float32), jnp.full((1,), 3.0, jnp.float32)
    if case.startswith("jax_ffi") and mul.route(ja, jb) != "xla_ffi":  # (a failed handler build falls back)
        raise SystemExit(case + ": to_jax's route is " + repr(mul.route(ja, jb)) + ", not its XLA FFI custom call")
    f = lambda: jax.block_until_ready(jit(ja, jb))
else:
    f = lambda: None
for _ in range(300):
    f()
subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], capture_output=True)
for _ in range(calls):
    f()
subprocess.run(["callgrind_control", "-i", "off", str(os.getpid())], capture_output=True)
"""


def count(case: str, calls: int, out: Path) -> int:
    """Instructions callgrind counted for ``calls`` calls of ``case`` (toggling included)."""
    f = out / f"callgrind.{case}"
    # one string hash seed for every case and run: dict lookups (an attribute, a method) probe alike each time
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    res = subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={f}",
                          sys.executable, "-c", CHILD.format(here=str(HERE)), case, str(calls)],
                         capture_output=True, text=True, env=env)
    m = re.search(r"Collected : (\d+)", res.stderr)
    if res.returncode != 0 or m is None:
        raise RuntimeError(f"{case}: valgrind exited {res.returncode}: {res.stderr.strip().splitlines()[-1:]}")
    return int(m.group(1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("cases", nargs="*", default=list(CASES[1:]))
    args = ap.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("valgrind is not installed: nothing counted")
        return 1
    try:
        import jax  # noqa: F401
    except ImportError:
        if any(c in JAX_CASES for c in args.cases):
            print(f"jax is not installed: {', '.join(c for c in args.cases if c in JAX_CASES)} not counted")
        args.cases = [c for c in args.cases if c not in JAX_CASES]
    if "direct_torch" in args.cases:  # its first call loads the bridge from the cache: have it there
        from opbuilder.bridges import torch_bridge
        if torch_bridge.ready(wait=True) is None:
            print(f"to_torch's C++ bridge: {torch_bridge.status()}: direct_torch not counted")
            args.cases.remove("direct_torch")
    out = Path(tempfile.mkdtemp(prefix="opbuilder-callgrind-"))
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=len(args.cases) + 1) as pool:  # counts do not depend on load
        jobs = {c: pool.submit(count, c, args.calls, out) for c in ["noop", *args.cases]}
        got, failed = {}, False
        for c, j in jobs.items():
            try:
                got[c] = j.result()
            except RuntimeError as e:  # (a row that could not be counted: named, and the exit status 1)
                print(f"FAIL: {c}: not measured: {e}")
                failed = True
    if "noop" not in got:
        return 1
    per = {c: (got[c] - got["noop"]) / args.calls for c in args.cases if c in got}
    print(f"instructions per call (callgrind, {args.calls} calls, the noop case subtracted); files in {out}")
    for c, v in per.items():
        print(f"  {c:22s} {v:9.0f}")
    for name, a, b, goal in (("issue 38 goal 3: to_torch / torch's plain C++ op", "to_torch", "torch_plain", 1.15),
                             ("issue 38 goal 2: the op on torch tensors / on numpy arrays", "direct_torch",
                              "direct_numpy", 1.3),
                            ("issue 38 goal 1: to_jax's default route / jnp, under jax.jit", "jax_ffi", "jnp", 1.3),
                            ("issue 38 goal 1, the gradient: to_jax's default route / jnp", "jax_ffi_grad", "jnp_grad",
                             1.3)):
        if a in per and b in per:
            q = per[a] / per[b]
            print(f"goal: {name} <= {goal}x (instructions; load average "
                  f"{', '.join(f'{v:.1f}' for v in os.getloadavg())}): {q:.2f}x: {'MET' if q <= goal else 'MISSED'}")
    if "direct_torch_exchange" in per and "direct_numpy" in per:  # no goal: not what a call gets by default
        print(f"the bridge off (OPBUILDER_TORCH_BRIDGE=0): the op on torch tensors / on numpy arrays "
              f"{per['direct_torch_exchange'] / per['direct_numpy']:.2f}x")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
