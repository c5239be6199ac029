"""What calling a C++ operator from PyTorch (opbuilder.to_torch) and JAX (opbuilder.to_jax) costs,
against peers measured in the same run.

    python benchmarks/interop.py [--rounds 7] [--only torch|jax] [--no-tvm]   # a few minutes (plus first builds)

Every operator runs bench::MulKernel (benchmarks/mul_kernel.h), built -O3:
opbuilder's Function<T> (benchmarks/opbuilder_mul.cpp, a pybind11 module; opbuilder_mul_nb.cpp, the
same op bound as OB_MODULE binds by default, with nanobind) wrapped by ``opbuilder.to_torch``, and
torch's own C++ extension ops built by cpp_extension.load: a torch::autograd::Function
(benchmarks/torch_function_mul.cpp, torch's slowest binding) and a plain op with no autograd
(benchmarks/torch_plain_mul.cpp: pybind11, and TORCH_LIBRARY through torch.ops). tvm-ffi (the package
apache-tvm-ffi), when installed, is one more peer: benchmarks/tvm_mul_alloc.cpp, its output allocated
by torch's allocator (skipped, and named, when absent or with --no-tvm).

Rows: one element forward (the call's fixed cost) and one element forward + backward
(torch.autograd.grad), each against torch's Function (issue 23's goal: within 1.5x); one element
forward against torch's plain C++ op (issue 38 goal 3: within 1.15x); one million elements against
torch's plain op (within 1.1x; the op on runtime tensors is shown beside it). One more 1-element row
calls the op itself (no to_torch) with torch tensors against the same op on numpy arrays (issue 38
goal 2: within 1.3x), twice: with the bridge off (OPBUILDER_TORCH_BRIDGE=0: torch tensors read through
torch's DLPack C exchange table, after its is_neg) and with to_torch's C++ bridge loaded (read by the
bridge's C++), which is what such calls get by default: the first one in a process loads the bridge
from the cache (torch_bridge.request; benchmarks/call_instructions.py's ``direct_torch`` counts a
process that does so). The wrapped op's eager calls go
through to_torch's C++ bridge (opbuilder/bridges/torch_bridge.py; built first if this cache has none,
~15 s); a "Python path" row times the same calls with the bridge off (OPBUILDER_TORCH_BRIDGE=0), and
a floor row a Python torch.autograd.Function that only calls torch's mul.

JAX rows (benchmarks/opbuilder_mul_xla.cpp: the same Function with InferShape and OB_XLA_FFI): under
jax.jit, the op as its own XLA custom call (FFI), through jax.pure_callback (to_jax(..., ffi=False)),
and as ``to_jax`` takes an operator by default (opbuilder_mul_nb.cpp, built without OB_XLA_FFI:
whatever route to_jax picks, named beside the table), against the jitted jnp expression x * y; one
million elements and one element, forward and forward + backward (issue 38 goal 1: within 1.2x of
jnp at 1M, 1.3x at one element).

Timings: benchmarks/timing.py; interleaved rounds, medians with min-max, one thread on every side.
Each goal line names the load average right after its rows were timed. Needs torch (torch rows) and
jax (JAX rows).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing  # noqa: E402  (first: pins the thread count before numpy and torch load)
from timing import Report, interleaved, ratio  # noqa: E402

import numpy as np  # noqa: E402

import runtime as rt  # noqa: E402

HERE = timing.HERE
ONE_ELEMENT_GOAL = 1.5  # issue 23: a wrapped 1-element op against torch's C++ extension op with autograd
PLAIN_GOAL = 1.15  # issue 38 goal 3: a wrapped 1-element op, no grad, against torch's plain C++ op
DIRECT_GOAL = 1.3  # issue 38 goal 2: the op on torch tensors (no to_torch) against the op on numpy arrays
BIG_GOAL = 1.1  # 1M elements: to_torch's op against torch's plain op, the same kernel
JAX_BIG_GOAL, JAX_ONE_GOAL = 1.2, 1.3  # issue 38 goal 1: to_jax under jit against jnp at 1M and at 1 element


def load_average() -> str:
    """The machine's 1-, 5- and 15-minute load averages, for a goal line."""
    import os
    return "load average " + ", ".join(f"{v:.1f}" for v in os.getloadavg())


def tvm_op(use: bool):
    """benchmarks/tvm_mul_alloc.cpp built by tvm-ffi (its own cache), or (None, why not)."""
    if not use:
        return None, "--no-tvm"
    try:
        import tvm_ffi.cpp
    except ImportError:
        return None, "apache-tvm-ffi is not installed (pip install apache-tvm-ffi)"
    try:
        return tvm_ffi.cpp.load("bench_tvm_mul_alloc", cpp_files=[str(HERE / "tvm_mul_alloc.cpp")],
                                extra_cflags=["-O3", f"-I{HERE}"]), None
    except Exception as e:  # noqa: BLE001 - a peer that cannot be built is named, not fatal
        return None, f"tvm-ffi could not build its op: {type(e).__name__}: {str(e).splitlines()[0][:120]}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds per group (default 7)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", choices=("torch", "jax"), help="run only the torch or the JAX rows")
    ap.add_argument("--no-tvm", action="store_true", help="leave out tvm-ffi's column")
    args = ap.parse_args(argv)
    R = args.rounds
    report = Report()
    if args.only != "torch":
        jax_rows(report, R)
    if args.only == "jax":
        return report.finish()
    torch = timing.load_torch()
    timing.header("calling a C++ operator from PyTorch (opbuilder.to_torch)", R, torch)
    if torch is None:
        report.fail("all rows", "torch is not installed")
        return report.finish()

    import os

    import opbuilder
    from opbuilder.bridges import torch_bridge
    from torch.utils.cpp_extension import load
    ob = opbuilder.CustomOpBuilder("bench_mul", [str(HERE / "opbuilder_mul.cpp")], cflags=["-O3"]).load()
    tf = load("bench_torch_function_mul", [str(HERE / "torch_function_mul.cpp")], extra_cflags=["-O3"],
              extra_include_paths=[str(HERE)], verbose=False)
    tp = load("bench_torch_plain_mul", [str(HERE / "torch_plain_mul.cpp")], extra_cflags=["-O3"],
              extra_include_paths=[str(HERE)], verbose=False)
    tlib = torch.ops.bench_plain.mul
    obn = opbuilder.CustomOpBuilder("bench_mul_nb", [str(HERE / "opbuilder_mul_nb.cpp")], cflags=["-O3"]).load()
    tvm, no_tvm = tvm_op(not args.no_tvm)

    # the op called straight with torch tensors (no to_torch) and with numpy arrays of the same values
    # (issue 38 goal 2): first with the bridge off (torch tensors read through DLPack's C exchange table;
    # the first call would otherwise load the bridge), again below once it is loaded (read by its C++)
    tx, ty = torch.full((1,), 2.0), torch.full((1,), 3.0)
    na, nb = tx.numpy().copy(), ty.numpy().copy()
    direct = {"torch": lambda: ob.mul(tx, ty), "numpy": lambda: ob.mul(na, nb),
              "torch_nb": lambda: obn.mul(tx, ty), "numpy_nb": lambda: obn.mul(na, nb)}
    if tvm is not None:
        direct["tvm"] = lambda: tvm.mul(tx, ty)
    os.environ[torch_bridge.ENV] = "0"
    rd0 = None if torch_bridge.status().startswith("loaded") else interleaved(direct, 5000, R)

    python_path = opbuilder.to_torch(ob)  # the bridge off: every call on the Python path
    os.environ[torch_bridge.ENV] = "1"
    wrapped = opbuilder.to_torch(ob)
    wrapped_nb = opbuilder.to_torch(obn)
    torch_bridge.ready(wait=True)
    print(f"to_torch's C++ bridge: {torch_bridge.status()}")
    print("sides' flags: opbuilder -O3 on its own flags (CustomOpBuilder cflags; bench_mul pybind11, bench_mul_nb "
          "nanobind); torch: cpp_extension.load's flags + -O3 (pybind11); "
          + ("tvm-ffi: tvm_ffi.cpp.load's flags + -O3" if tvm is not None else f"tvm-ffi: skipped ({no_tvm})")
          + "; no PCH matters here (calls, not builds)")

    # ---- one element ---------------------------------------------------------------------
    # the floor of any Python-side bridge: a torch.autograd.Function written in Python around torch's own mul
    class PyMul(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return a * b

        @staticmethod
        def backward(ctx, g):
            a, b = ctx.saved_tensors
            return g * b, g * a

    one = {"wrapped": lambda: wrapped.mul(tx, ty), "tf": lambda: tf.mul(tx, ty),
           "python": lambda: python_path.mul(tx, ty), "plain": lambda: tp.mul(tx, ty),
           "tlib": lambda: tlib(tx, ty), "wrapped_nb": lambda: wrapped_nb.mul(tx, ty)}
    if tvm is not None:
        one["tvm"] = lambda: tvm.mul(tx, ty)
    r1 = interleaved(one, 5000, R)
    load_r1 = load_average()

    # the same calls straight, now that the bridge is loaded
    rd = interleaved(direct, 5000, R)
    load_rd = load_average()

    gx, gy = tx.clone().requires_grad_(True), ty.clone().requires_grad_(True)

    def fwd_bwd(f):
        def run():
            out = f(gx, gy)
            return torch.autograd.grad(out, (gx, gy))
        return run
    r2 = interleaved({"wrapped": fwd_bwd(wrapped.mul), "tf": fwd_bwd(tf.mul), "pyfn": fwd_bwd(PyMul.apply),
                      "python": fwd_bwd(python_path.mul)}, 1000, R)
    load_r2 = load_average()

    # ---- one million elements: the same op on torch tensors and on runtime tensors -----------
    n = 1 << 20
    rng = np.random.default_rng(0)
    xa, ya = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    x, y = rt.Tensor(xa), rt.Tensor(ya)
    bx, by = torch.from_numpy(xa.copy()), torch.from_numpy(ya.copy())
    big = {"wrapped": lambda: wrapped.mul(bx, by), "runtime": lambda: ob.mul(x, y),
           "tf": lambda: tf.mul(bx, by), "plain": lambda: tp.mul(bx, by)}
    if tvm is not None:
        big["tvm"] = lambda: tvm.mul(bx, by)
    rm = interleaved(big, 20, 2 * R)
    load_rm = load_average()

    print()
    timing.table(["case", "to_torch(op) on torch tensors", "other side", "ratio"], [
        ["forward, no grad, 1 element", r1["wrapped"].fmt("auto"), "torch C++ Function " + r1["tf"].fmt("auto"),
         ratio(r1["wrapped"], r1["tf"]).fmt("x")],
        ["forward + backward, 1 element", r2["wrapped"].fmt("auto"), "torch C++ Function " + r2["tf"].fmt("auto"),
         ratio(r2["wrapped"], r2["tf"]).fmt("x")],
        ["the Python path (bridge off), forward, no grad, 1 element", r1["python"].fmt("auto"),
         "torch C++ Function " + r1["tf"].fmt("auto"), ratio(r1["python"], r1["tf"]).fmt("x")],
        ["the Python path (bridge off), forward + backward, 1 element", r2["python"].fmt("auto"),
         "torch C++ Function " + r2["tf"].fmt("auto"), ratio(r2["python"], r2["tf"]).fmt("x")],
        ["a Python torch.autograd.Function (torch's mul inside), forward + backward, 1 element",
         r2["pyfn"].fmt("auto"), "torch C++ Function " + r2["tf"].fmt("auto"), ratio(r2["pyfn"], r2["tf"]).fmt("x")],
        [f"forward, no grad, {n} elements", rm["wrapped"].fmt("auto"), "op on runtime tensors "
         + rm["runtime"].fmt("auto"), ratio(rm["wrapped"], rm["runtime"]).fmt("x")],
        [f"forward, no grad, {n} elements", rm["wrapped"].fmt("auto"), "torch C++ Function " + rm["tf"].fmt("auto"),
         ratio(rm["wrapped"], rm["tf"]).fmt("x")],

        ["the op (no to_torch) called with torch tensors, 1 element", rd["torch"].fmt("auto"),
         "the op on numpy arrays " + rd["numpy"].fmt("auto"), ratio(rd["torch"], rd["numpy"]).fmt("x")],
    ])
    print("\nThe 1-element rows are each call's fixed cost. Through the bridge, torch tensors reach the C++ "
          "operator directly and its node is a C++ torch autograd node; the Python path pays for signatures, "
          "conversions and a Python torch.autograd.Function, whose cost alone (the last 1-element row) "
          "leaves almost nothing of the 1.5x goal for the conversions around it.\n")

    # ---- the peers: torch's plain C++ op (no autograd), torch.ops, tvm-ffi -----------------------------
    def peer(r, key):
        return r[key].fmt("auto") if key in r else f"skipped ({no_tvm})"

    print()
    timing.table(["peers, forward, no grad", "to_torch(op)", "to_torch(op), nanobind build", "torch plain C++ op",
                  "torch.ops (TORCH_LIBRARY)", "torch C++ Function", "tvm-ffi", "to_torch / torch plain"], [
        ["peers: 1 element", r1["wrapped"].fmt("auto"), r1["wrapped_nb"].fmt("auto"), r1["plain"].fmt("auto"),
         r1["tlib"].fmt("auto"), r1["tf"].fmt("auto"), peer(r1, "tvm"), ratio(r1["wrapped"], r1["plain"]).fmt("x")],
        [f"peers: {n} elements", rm["wrapped"].fmt("auto"), "", rm["plain"].fmt("auto"), "", rm["tf"].fmt("auto"),
         peer(rm, "tvm"), ratio(rm["wrapped"], rm["plain"]).fmt("x")],
    ])
    print()
    rows = []
    for when, r in (("the bridge off", rd0), ("the bridge loaded (the default)", rd)):
        if r is None:
            continue
        rows += [[f"pybind11 build (bench_mul), {when}", r["torch"].fmt("auto"), r["numpy"].fmt("auto"),
                  peer(r, "tvm"), ratio(r["torch"], r["numpy"]).fmt("x")],
                 [f"nanobind build (bench_mul_nb), {when}", r["torch_nb"].fmt("auto"), r["numpy_nb"].fmt("auto"),
                  "", ratio(r["torch_nb"], r["numpy_nb"]).fmt("x")]]
    timing.table(["the op called straight (no to_torch), 1 element", "torch tensors", "numpy arrays",
                  "tvm-ffi on torch tensors", "torch / numpy"], rows)
    print()
    for label, r, la in (("forward", r1, load_r1), ("forward + backward", r2, load_r2)):
        one = ratio(r["wrapped"], r["tf"])
        report.goal(f"1 element, {label}: to_torch op <= {ONE_ELEMENT_GOAL}x torch's C++ Function (issue 23; {la})",
                    one.median <= ONE_ELEMENT_GOAL, one.fmt("x"))
    for build, key in (("pybind11 build", "wrapped"), ("nanobind build, opbuilder's default", "wrapped_nb")):
        plain = ratio(r1[key], r1["plain"])
        report.goal(f"1 element, forward, no grad: to_torch op ({build}) <= {PLAIN_GOAL}x torch's plain C++ op "
                    f"(issue 38; {load_r1})", plain.median <= PLAIN_GOAL, plain.fmt("x"))
    for build, t, a in (("pybind11 build", "torch", "numpy"), ("nanobind build", "torch_nb", "numpy_nb")):
        direct = ratio(rd[t], rd[a])  # the bridge-off rows above have no goal: not what a call gets by default
        report.goal(f"1 element, the bridge loaded (the default): the op ({build}) called straight with torch "
                    f"tensors <= {DIRECT_GOAL}x the op on numpy arrays (issue 38; {load_rd})",
                    direct.median <= DIRECT_GOAL, direct.fmt("x"))
    big = ratio(rm["wrapped"], rm["plain"])
    report.goal(f"1M elements: to_torch op on torch tensors within {BIG_GOAL}x of torch's plain C++ op ({load_rm})",
                big.median <= BIG_GOAL, big.fmt("x"))
    return report.finish()


def jax_rows(report: Report, R: int) -> None:
    """to_jax's routes for one op (its own XLA FFI custom call, pure_callback, and the route to_jax takes
    by default for an op built without OB_XLA_FFI) against jitted jnp."""
    import inspect
    import os
    import types
    # XLA's CPU client on one thread, like every other side here (before jax loads)
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        print("jax not installed: the JAX rows are skipped")
        return
    import opbuilder
    print(f"\ncalling a C++ operator from JAX (opbuilder.to_jax), jax {jax.__version__}, CPU, jitted")
    ob = opbuilder.CustomOpBuilder("bench_mul_xla", [str(HERE / "opbuilder_mul_xla.cpp")], cflags=["-O3"],
                                   include_paths=[jax.ffi.include_dir()]).load()
    obn = opbuilder.CustomOpBuilder("bench_mul_nb", [str(HERE / "opbuilder_mul_nb.cpp")], cflags=["-O3"]).load()
    ffi = opbuilder.to_jax(ob)
    if "ffi" in inspect.signature(opbuilder.to_jax).parameters:
        cb = opbuilder.to_jax(ob, ffi=False)
    else:  # before to_jax took ffi=: the module without its capsules
        cb = opbuilder.to_jax(types.SimpleNamespace(mul=ob.mul, mul_infer_shape=ob.mul_infer_shape))
    dflt = opbuilder.to_jax(obn)
    sides = {"ffi": ffi.mul, "callback": cb.mul, "default": dflt.mul, "jnp": lambda a, b: a * b}
    fwd = {k: jax.jit(f) for k, f in sides.items()}
    grad = {k: jax.jit(jax.grad(lambda a, b, f=f: f(a, b).sum(), argnums=(0, 1))) for k, f in sides.items()}

    def cases(fns, a, b):
        return {k: (lambda f=f: jax.block_until_ready(f(a, b))) for k, f in fns.items()}

    rng = np.random.default_rng(0)
    n = 1 << 20
    xa, ya = (jnp.asarray(rng.standard_normal(n).astype(np.float32)) for _ in range(2))
    x1, y1 = jnp.full((1,), 2.0, jnp.float32), jnp.full((1,), 3.0, jnp.float32)
    route = getattr(dflt.mul, "route", None)
    print("to_jax's default route for the op built without OB_XLA_FFI: "
          + (str(route(x1, y1)) if route is not None else "(to_jax names no route here)"))
    rows = []
    results = {}
    loads = {}
    for label, fns, a, b, number in [(f"forward, {n} elements", fwd, xa, ya, 20),
                                     (f"forward + backward, {n} elements", grad, xa, ya, 10),
                                     ("forward, 1 element", fwd, x1, y1, 2000),
                                     ("forward + backward, 1 element", grad, x1, y1, 1000)]:
        r = interleaved(cases(fns, a, b), number, 2 * R)
        results[label] = r
        loads[label] = load_average()
        rows.append([label, r["ffi"].fmt("auto"), r["callback"].fmt("auto"), r["jnp"].fmt("auto"),
                     ratio(r["ffi"], r["jnp"]).fmt("x"), ratio(r["callback"], r["jnp"]).fmt("x"),
                     r["default"].fmt("auto"), ratio(r["default"], r["jnp"]).fmt("x")])
    print()
    timing.table(["case (jax.jit)", "FFI custom call", "pure_callback", "jnp x * y", "FFI / jnp",
                  "callback / jnp", "to_jax default", "default / jnp"], rows)
    for label in results:
        goal = JAX_BIG_GOAL if str(n) in label else JAX_ONE_GOAL
        for side, name in (("ffi", "to_jax op (OB_XLA_FFI)"), ("default", "to_jax op (default route)")):
            if side == "ffi" and str(n) not in label:
                continue  # the goals at one element are the default route's (issue 38 goal 1)
            q = ratio(results[label][side], results[label]["jnp"])
            report.goal(f"{label} under jit: {name} within {goal}x of the jitted jnp expression ({loads[label]})",
                        q.median <= goal, q.fmt("x"))


if __name__ == "__main__":
    sys.exit(main())
