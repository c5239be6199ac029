"""runtime.jit speed: a GELU (tanh form) chain on 1M float32 (eager vs O0 vs O1, and PyTorch eager --
and torch.compile with --torch-compile -- when torch is importable), a cached jitted call on 1-element
tensors vs the same ops eagerly, a jitted value_and_grad of a small net whose heavy part is a C++ Function
op (1M float32) vs eagerly, and the cold build of a fused kernel.

    python benchmarks/jit.py [--rounds N] [--threads 1] [--torch-compile]   # about a minute

Every side runs on the same thread count (default 1: the fused kernel is single-threaded, and torch is
pinned with torch.set_num_threads). The cases of a row are timed in one interleaved block
(benchmarks/timing.py); figures are medians with min-max, ratios taken round by round.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing  # noqa: E402  (first: pins the thread count before numpy and torch load)
from timing import Report, interleaved, ratio  # noqa: E402

import numpy as np  # noqa: E402

import runtime as rt  # noqa: E402
from runtime import Tensor, jit, mint  # noqa: E402


def gelu(x):
    return 0.5 * x * (1 + mint.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))


def torch_cases(x: np.ndarray, with_compile: bool) -> dict:
    """torch eager (and torch.compile) GELU cases on the same data, or none without torch."""
    torch = timing.load_torch()
    if torch is None:
        return {}
    t = torch.from_numpy(x)

    def tg(v):
        return 0.5 * v * (1 + torch.tanh(0.7978845608 * (v + 0.044715 * v * v * v)))
    cases = {"torch eager": lambda: tg(t)}
    if with_compile:
        try:
            compiled = torch.compile(tg)
            compiled(t)
            cases["torch.compile (inductor)"] = lambda: compiled(t)
        except Exception as e:  # inductor needs a working compiler setup
            print(f"torch.compile unavailable: {type(e).__name__}: {e}")
    else:
        print("torch.compile not timed (its first compile takes minutes here): pass --torch-compile")
    return cases


def custom_op_rows(rounds: int):
    """value_and_grad of a net around two C++ Function ops (tests/cpp/jit_counted_ops.cpp) on 1M float32:
    eager, jitted; and how many op forwards one jitted step runs (1 per op: its backward uses the forward's
    node; 2 when the backward ran the op again)."""
    from opbuilder import CustomOpBuilder
    from runtime import Parameter
    root = Path(__file__).resolve().parents[1]
    cops = CustomOpBuilder("jit_counted_ops", [str(root / "tests" / "cpp" / "jit_counted_ops.cpp")]).load()
    rng = np.random.default_rng(1)
    w = Parameter(Tensor(rng.standard_normal(1 << 20).astype(np.float32)), name="w")

    def net(x):
        h = cops.scaled_mul(mint.sin(x), w, 1.5)
        return mint.sum(cops.tanh(h) * x)

    x = Tensor(rng.standard_normal(1 << 20).astype(np.float32))
    eager = rt.value_and_grad(net, grad_position=0, weights=[w])
    jitted = rt.value_and_grad(jit(net), grad_position=0, weights=[w])
    jitted(x)
    before = cops.forwards()
    jitted(x)
    per_step = cops.forwards() - before
    t = interleaved({"eager": lambda: eager(x), "jit": lambda: jitted(x)}, 5, rounds)
    return t["eager"], t["jit"], per_step


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--torch-compile", action="store_true", help="also time torch.compile (slow first compile)")
    args = ap.parse_args()
    os.environ.setdefault("OPBUILDER_CACHE_DIR", tempfile.mkdtemp(prefix="ob-jit-bench-"))
    report = Report()

    # cold build of a fused kernel (a fresh cache: the generated source compiles once)
    x1 = Tensor(np.float32(0.5))
    cold_fn = jit(lambda v: mint.exp(mint.sin(v) * 3.0 + v) - 1.0, jit_level="O1")
    from runtime.ops.aot_trampoline import trampoline
    trampoline()
    t0 = time.perf_counter()
    cold_fn(x1)
    cold = time.perf_counter() - t0

    x = Tensor(np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32))
    o0, o1 = jit(gelu, jit_level="O0"), jit(gelu, jit_level="O1")
    o0(x), o1(x)
    err = float(np.abs(o1(x).asnumpy() - gelu(x).asnumpy()).max())
    cases = {"eager (runtime ops)": lambda: gelu(x), "jit O0": lambda: o0(x), "jit O1 (fused kernel)": lambda: o1(x)}
    torch_gelu = torch_cases(x.asnumpy(), args.torch_compile)
    cases.update(torch_gelu)
    timing.header(f"runtime.jit; GELU (tanh) on {x.size} float32", args.rounds,
                  sys.modules.get("torch") if torch_gelu else None)
    t = interleaved(cases, 10, args.rounds)
    eager = t["eager (runtime ops)"]
    timing.table(["case", "time", "eager / case", "case / jit O1"],
                 [[name, v.fmt("ms", 3), ratio(eager, v).fmt("x"), ratio(v, t["jit O1 (fused kernel)"]).fmt("x")]
                  for name, v in t.items()])
    print(f"\nO1 max abs difference from eager: {err:.2e}")

    small = jit(gelu)
    s = Tensor(np.float32(0.3))
    small(s)
    ts = interleaved({"eager": lambda: gelu(s), "jit": lambda: small(s)}, 2000, args.rounds)
    r_small = ratio(ts["jit"], ts["eager"])
    print(f"1-element GELU: eager {ts['eager'].fmt('us')}, cached jitted call (O0) {ts['jit'].fmt('us')} "
          f"(jit / eager {r_small.fmt('x')})")

    e_vg, j_vg, per_step = custom_op_rows(args.rounds)
    r_vg = ratio(j_vg, e_vg)
    print(f"value_and_grad, net around 2 C++ Function ops on 1M float32: eager {e_vg.fmt('ms', 3)}, "
          f"jitted {j_vg.fmt('ms', 3)} (jit / eager {r_vg.fmt('x')}); op forwards per jitted step: {per_step}")
    print(f"cold build of a fused kernel (trace + generate + compile + load, one sample): {cold:.2f} s\n")

    r_o0 = ratio(eager, t["jit O0"])
    r_o1 = ratio(eager, t["jit O1 (fused kernel)"])
    report.goal("O0 no slower than eager (eager / O0 >= 1)", r_o0.median >= 1.0, f"{r_o0.median:.2f}x")
    report.goal("O1 at least 3x faster than eager", r_o1.median >= 3.0, f"{r_o1.median:.2f}x")
    if "torch eager" in t:
        r_t = ratio(t["torch eager"], t["jit O1 (fused kernel)"])
        report.goal(f"O1 faster than torch eager, both on {timing.THREADS} thread(s)", r_t.median > 1.0,
                    f"torch / O1 {r_t.median:.2f}x")
    report.goal("cached 1-element jitted call no slower than eager", r_small.median <= 1.0,
                f"jit / eager {r_small.median:.2f}x")
    report.goal("a jitted step runs each C++ op's forward once", per_step == 2, f"{per_step} for 2 ops")
    report.goal("cold fused-kernel build <= 1.5 s", cold <= 1.5, f"{cold:.2f} s")
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
