"""What a C++ operator costs under jax.jit through to_jax's default route (issue 38, goal 1).

    python benchmarks/jax_ffi.py [--rounds 7]   # about a minute (plus first builds: the op, and
                                                 # to_jax's generic XLA FFI handlers once per JAX version)

The operator is benchmarks/opbuilder_mul.cpp's ``mul``: a Function<T> (bench::MulKernel) with no
OB_XLA_FFI line and no XLA headers in its build. ``to_jax(module)`` runs it as an XLA custom call
through the generic handlers (src/jax_ffi.cpp); ``to_jax(module, ffi=False)`` is the named fallback,
jax.pure_callback. The peer is the jitted jnp expression ``a * b``. Forward is ``jit(f)(a, b)``;
forward + backward is ``jit(grad(lambda a, b: f(a, b).sum(), argnums=(0, 1)))``. XLA's CPU client runs
on one thread, like the operator. Goals: within 1.3x of jnp at 1 element, forward and forward +
backward within 1.2x at 1M elements (2**20 float32). A last row, with no goal, takes the gradient of
``(f(a, b) * w).sum()``: there XLA cannot reduce jnp's backward to two copies of the inputs, as it
does for ``f(a, b).sum()`` (an opaque custom call always runs the C++ Forward and Backward).
Another, with no goal, times a Python function of two C++ calls: it runs as the host custom call
(to_jax's callback code with the GIL), against ``ffi=False`` and jnp ``a * b * b``.
One more takes the gradient with respect to ``a`` only: the backward computes that gradient alone.
The last 1M row's loss reads the output, ``(f(a, b) ** 2).sum()``: the forward custom call keeps its
context (a tape, named by a token result) and the backward runs Backward on it, without Forward again.

Why forward + backward at 1M is not within 1.2x of jnp: XLA folds jnp's gradient of ``(a * b).sum()``
into two copies (d/da = b, d/db = a; the forward is dead), while the custom calls run the C++ Forward
(its context, which the token keeps alive) and then Backward's two multiplies, on a cotangent of ones
XLA writes out. The floor line under the table times that same work in jnp (``a * b``, ``ct * b``,
``ct * a``, the ones given), so FFI / floor says what the handlers add over the kernels they run.
"""
from __future__ import annotations

import argparse
import os
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing  # noqa: E402  (first: pins the thread count before numpy loads)
from timing import Report, interleaved, ratio  # noqa: E402

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    report = Report()
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        print("jax not installed: nothing to measure")
        return 0
    import opbuilder
    timing.header(f"to_jax under jax.jit, jax {jax.__version__}, CPU (XLA on one thread)", args.rounds)
    ob = opbuilder.CustomOpBuilder("bench_mul", [str(HERE / "opbuilder_mul.cpp")], cflags=["-O3"]).load()
    ffi, cb = opbuilder.to_jax(ob), opbuilder.to_jax(ob, ffi=False)
    sides = {"ffi": ffi.mul, "callback": cb.mul, "jnp": lambda a, b: a * b}
    fwd = {k: jax.jit(f) for k, f in sides.items()}
    grad = {k: jax.jit(jax.grad(lambda a, b, f=f: f(a, b).sum(), argnums=(0, 1))) for k, f in sides.items()}
    rng = np.random.default_rng(0)
    n = 1 << 20
    xa, ya, wa = (jnp.asarray(rng.standard_normal(n).astype(np.float32)) for _ in range(3))
    # the same with a cotangent that is not ones: XLA cannot fold jnp's backward into two copies
    wgrad = {k: jax.jit(jax.grad(lambda a, b, f=f: (f(a, b) * wa).sum(), argnums=(0, 1)))
             for k, f in sides.items()}
    x1, y1 = jnp.full((1,), 2.0, jnp.float32), jnp.full((1,), 3.0, jnp.float32)
    print(f"route of mul: {ffi.mul.route(x1, y1)!r}; with ffi=False: {cb.mul.route(x1, y1)!r}")
    if ffi.mul.route(x1, y1) != "xla_ffi":  # (a failed handler build falls back: its figures would be the callback's)
        report.fail("every row", f"to_jax's default route is {ffi.mul.route(x1, y1)!r}, not its XLA FFI custom call")
        return report.finish()
    for fns, a, b in ((fwd, xa, ya), (grad, xa, ya)):  # same values on every side
        got = [np.asarray(fns[k](a, b)[0] if fns is grad else fns[k](a, b)) for k in sides]
        for g in got[1:]:
            np.testing.assert_allclose(g, got[0], rtol=1e-6)
    grad_a = {k: jax.jit(jax.grad(lambda a, b, f=f: f(a, b).sum())) for k, f in sides.items()}
    # a loss that reads the output: the backward runs Backward on the forward's context (no Forward again)
    grad_sq = {k: jax.jit(jax.grad(lambda a, b, f=f: (f(a, b) ** 2).sum(), argnums=(0, 1))) for k, f in sides.items()}
    # a Python function of two C++ calls: the host custom call (Python, with the GIL)
    two = types.SimpleNamespace(mul2=lambda a, b: ob.mul(ob.mul(a, b), b))
    host, host_cb = opbuilder.to_jax(two).mul2, opbuilder.to_jax(two, ffi=False).mul2
    print(f"route of a two-op function: {host.route(x1, y1)!r}")
    two_fwd = {"ffi": jax.jit(host), "callback": jax.jit(host_cb), "jnp": jax.jit(lambda a, b: a * b * b)}
    rows, results = [], {}
    for label, fns, a, b, number in [("forward, 1 element", fwd, x1, y1, 2000),
                                     ("forward + backward, 1 element", grad, x1, y1, 1000),
                                     (f"forward, {n} elements", fwd, xa, ya, 20),
                                     (f"forward + backward, {n} elements", grad, xa, ya, 10),
                                     (f"forward + backward, cotangent w, {n} elements (no goal)", wgrad, xa, ya,
                                      10),
                                     (f"forward + backward, d/da only, {n} elements (no goal)", grad_a, xa, ya,
                                      10),
                                     (f"forward + backward, loss (f ** 2).sum(), {n} elements (no goal)", grad_sq,
                                      xa, ya, 10),
                                     ("two ops, host custom call, forward, 1 element (no goal)", two_fwd, x1, y1,
                                      1000)]:
        cases = {k: (lambda f=f: jax.block_until_ready(f(a, b))) for k, f in fns.items()}
        r = results[label] = interleaved(cases, number, args.rounds)
        rows.append([label, r["ffi"].fmt("auto"), r["callback"].fmt("auto"), r["jnp"].fmt("auto"),
                     ratio(r["ffi"], r["jnp"]).fmt("x"), ratio(r["callback"], r["jnp"]).fmt("x")])
    print()
    timing.table(["case (jax.jit)", "to_jax (XLA FFI, default)", "ffi=False (pure_callback)", "jnp a * b",
                  "FFI / jnp", "callback / jnp"], rows)
    # the floor of forward + backward through the custom calls: the same kernels' work in jnp
    ones = jnp.ones_like(xa)
    floor = jax.jit(lambda a, b, ct: (ct * b, ct * a, a * b))
    fl = interleaved({"ffi": lambda: jax.block_until_ready(grad["ffi"](xa, ya)),
                      "floor": lambda: jax.block_until_ready(floor(xa, ya, ones))}, 10, args.rounds)
    print(f"floor, forward + backward, {n} elements: jnp (ct * b, ct * a, a * b), ones given: "
          f"{fl['floor'].fmt('auto')}; FFI {fl['ffi'].fmt('auto')}; "
          f"FFI / floor {ratio(fl['ffi'], fl['floor']).fmt('x')}")
    print(f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    for label, limit in [("forward, 1 element", 1.3), ("forward + backward, 1 element", 1.3),
                         (f"forward, {n} elements", 1.2), (f"forward + backward, {n} elements", 1.2)]:
        q = ratio(results[label]["ffi"], results[label]["jnp"])
        report.goal(f"to_jax op under jit, {label}, within {limit}x of jnp (load average {load})",
                    q.median <= limit, q.fmt("x"))
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
