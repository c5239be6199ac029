"""runtime.jit speed: a GELU (tanh form) chain on 1M float32 (eager vs O0 vs O1, and PyTorch eager and
torch.compile when torch is importable), a cached jitted call on 1-element tensors vs the same ops
eagerly, a jitted value_and_grad of a small net whose heavy part is a C++ Function op (1M float32) vs
eagerly, and the cold build of a fused kernel. Ratios are from one run of this script.

    python benchmarks/jit.py [--rounds N]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import runtime as rt  # noqa: E402
from runtime import Tensor, jit, mint  # noqa: E402


def gelu(x):
    return 0.5 * x * (1 + mint.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))


def best(fn: Callable[[], object], rounds: int, number: int) -> float:
    return min(timeit.repeat(fn, repeat=rounds, number=number)) / number


def torch_rows(x: np.ndarray, rounds: int):
    try:
        import torch
    except ImportError:
        return None, None
    t = torch.from_numpy(x)

    def tg(v):
        return 0.5 * v * (1 + torch.tanh(0.7978845608 * (v + 0.044715 * v * v * v)))
    eager = best(lambda: tg(t), rounds, 10)
    try:
        compiled = torch.compile(tg)
        compiled(t)
        comp = best(lambda: compiled(t), rounds, 10)
    except Exception as e:  # inductor needs a working compiler setup
        print(f"torch.compile unavailable: {e}")
        comp = None
    return eager, comp


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
    return best(lambda: eager(x), rounds, 5), best(lambda: jitted(x), rounds, 5), per_step


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    os.environ.setdefault("OPBUILDER_CACHE_DIR", tempfile.mkdtemp(prefix="ob-jit-bench-"))

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
    eager = best(lambda: gelu(x), args.rounds, 10)
    t_o0 = best(lambda: o0(x), args.rounds, 10)
    t_o1 = best(lambda: o1(x), args.rounds, 10)
    t_eager, t_comp = torch_rows(x.asnumpy(), args.rounds)

    small = jit(gelu)
    s = Tensor(np.float32(0.3))
    small(s)
    e_small = best(lambda: gelu(s), args.rounds, 2000)
    j_small = best(lambda: small(s), args.rounds, 2000)

    e_vg, j_vg, per_step = custom_op_rows(args.rounds)

    ms = lambda v: "—" if v is None else f"{v * 1e3:8.3f} ms"  # noqa: E731
    print(f"numpy {np.__version__}; best of {args.rounds} rounds; GELU (tanh) on {x.size} float32")
    print("| case | time | eager / case |\n|---|---|---|")
    for name, v in (("eager (runtime ops)", eager), ("jit O0", t_o0), ("jit O1 (fused kernel)", t_o1),
                    ("torch eager", t_eager), ("torch.compile (inductor)", t_comp)):
        print(f"| {name} | {ms(v)} | {'—' if v is None else f'{eager / v:.2f}x'} |")
    print(f"\nO1 max abs difference from eager: {err:.2e}")
    print(f"1-element GELU: eager {e_small * 1e6:.2f} us, cached jitted call (O0) {j_small * 1e6:.2f} us "
          f"(jit / eager = {j_small / e_small:.2f})")
    print(f"value_and_grad, net around 2 C++ Function ops on 1M float32: eager {ms(e_vg)}, jitted {ms(j_vg)} "
          f"(jit / eager = {j_vg / e_vg:.2f}); op forwards per jitted step: {per_step}")
    print(f"cold build of a fused kernel (trace + generate + compile + load): {cold:.2f} s")
    print(f"[{'met' if t_o0 <= eager else 'MISSED'}] O0 no slower than eager ({eager / t_o0:.2f}x)")
    print(f"[{'met' if eager / t_o1 >= 3 else 'MISSED'}] O1 at least 3x faster than eager ({eager / t_o1:.2f}x)")
    if t_eager is not None:
        print(f"[{'met' if t_o1 < t_eager else 'MISSED'}] O1 faster than torch eager ({t_eager / t_o1:.2f}x)")
    print(f"[{'met' if j_small <= e_small else 'MISSED'}] cached 1-element jitted call no slower than eager")
    print(f"[{'met' if per_step == 2 else 'MISSED'}] a jitted step runs each C++ op's forward once ({per_step} for 2)")
    print(f"[{'met' if cold <= 1.5 else 'MISSED'}] cold fused-kernel build <= 1.5 s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
