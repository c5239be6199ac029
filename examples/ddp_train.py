"""Data-parallel training with torch.distributed (DDP, gloo, 2 ranks on localhost) through an opbuilder
operator, checked against the same training in one process.

    python examples/ddp_train.py [--steps 5] [--ranks 2] [--name ddp_ops] [--out DIR]
    python examples/ddp_train.py --shipped     # the operator of an installed examples/shipped_pkg wheel

The model is examples/torch_train.py's gated linear layer in float64: y = linear(mul(x, gate)), where
``mul`` is the README's C++ operator (custom_src/function_ops.cpp, a Function with its Backward) turned
into a torch operator by ``opbuilder.to_torch``. With ``--shipped`` the gate goes through
``sq_mul(x, gate) = x * x * gate`` of the package examples/shipped_pkg, whose wheel carries the binary
(docs/shipping.md: ``python -m opbuilder wheel examples/shipped_pkg``, then pip install it): the
ranks load it with no compiler and build nothing. Each rank is a process (torch.multiprocessing.spawn,
env:// rendezvous on a free port) that trains on its half of each batch; DDP averages the gradients
over the ranks (gloo all-reduce). Then this process trains the same model on the whole batch alone,
and compares the gradients of every step and the final parameters (float64, rtol 1e-12).

Every rank calls ``CustomOpBuilder(name, sources).load()`` at the same moment, on one cache
(OPBUILDER_CACHE_DIR, or ~/.cache/opbuilder): the cache's lock lets one rank compile while the
other waits, then both import the one published library. Each rank counts the builds the
``opbuilder`` logger records ("built NAME in ...", docs/reference/builder.md), and rank 0 prints the
total: ``compiles of NAME across ranks: 1`` when the library was not yet built, 0 when it was.
``--name`` names the operator (a new name is a new cache key: a cold build).

Prints one line per step and ``max |DDP - single| ...``; exits 1 when they differ. ``--out DIR``
writes the figures to DIR/ddp_result.json (tests/test_distributed.py reads them).
"""
from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent
sys.path.append(str(HERE.parent))  # run from a checkout without installing (an installed opbuilder comes first)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import opbuilder  # noqa: E402

SOURCE = HERE.parent / "custom_src" / "function_ops.cpp"
BATCH, FEATURES, LR = 64, 8, 0.1


class GatedLinear(torch.nn.Module):
    """y = linear(mul(x, gate)), or linear(sq_mul(x, gate)) with the shipped operator: the gate goes
    through the C++ operator."""

    def __init__(self, ops, features: int) -> None:
        super().__init__()
        self.ops = ops
        self.gate = torch.nn.Parameter(torch.ones(features, dtype=torch.float64))
        self.linear = torch.nn.Linear(features, 1, dtype=torch.float64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self.ops, "sq_mul"):  # shipped_pkg's operator takes one shape: the gate expanded to x's
            return self.linear(self.ops.sq_mul(x, self.gate.expand_as(x)))
        return self.linear(self.ops.mul(x, self.gate))


def data(step: int) -> tuple:
    """The batch of ``step``: the same on every rank (each takes its rows), float64."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH, FEATURES, generator=g, dtype=torch.float64)
    y = (x * torch.linspace(0.0, 2.0, FEATURES, dtype=torch.float64)).sum(1, keepdim=True)
    return x, y + 0.01 * torch.randn(BATCH, 1, generator=g, dtype=torch.float64)


SHIPPED = "shipped"  # the name that stands for examples/shipped_pkg's installed operator


def load_ops(name: str):
    """The operator as torch operators: CustomOpBuilder(...).load() (or the installed shipped_pkg's,
    which calls it on import), then to_torch."""
    if name == SHIPPED:
        import shipped_pkg  # examples/shipped_pkg, installed from its wheel
        return opbuilder.to_torch(shipped_pkg.ops)
    return opbuilder.to_torch(opbuilder.CustomOpBuilder(name, [str(SOURCE)]).load())


def make_model(ops) -> GatedLinear:
    torch.manual_seed(0)  # every rank and the single run start from the same parameters
    return GatedLinear(ops, FEATURES)


def train(model: torch.nn.Module, steps: int, rank: int = 0, world: int = 1) -> Dict[str, list]:
    """SGD on rows ``rank::world`` of each batch; the gradients of each step and the final parameters."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    grads: List[List[list]] = []
    losses: List[float] = []
    for step in range(steps):
        x, y = data(step)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[rank::world]), y[rank::world])
        loss.backward()  # under DDP: the gradients are averaged over the ranks here
        grads.append([p.grad.detach().clone().tolist() for p in model.parameters()])
        losses.append(loss.item())
        opt.step()
    return {"grads": grads, "losses": losses, "params": [p.detach().clone().tolist() for p in model.parameters()]}


class _Builds(logging.Handler):
    """Counts the builds the ``opbuilder`` logger records, by operator name."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.names: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg == "built %s in %.1fs":
            self.names.append(str(record.args[0]))


def _rank(rank: int, world: int, port: int, steps: int, name: str, out: str) -> None:
    """One DDP rank: join the group, load the operator (all ranks at once), train on its rows."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
    try:
        _train_rank(rank, world, steps, name, out)
    finally:  # gloo's threads end here, while the interpreter is whole (left to exit, one may abort it)
        dist.destroy_process_group()


def _train_rank(rank: int, world: int, steps: int, name: str, out: str) -> None:
    builds = _Builds()
    logger = logging.getLogger("opbuilder")
    logger.addHandler(builds)
    logger.setLevel(logging.INFO)
    dist.barrier()  # every rank calls load() at the same moment
    t0 = time.perf_counter()
    ops = load_ops(name)
    load_s = time.perf_counter() - t0
    model = torch.nn.parallel.DistributedDataParallel(make_model(ops))
    result = train(model, steps, rank, world)
    mine = {"rank": rank, "compiles": builds.names.count(_op_name(name)), "all_builds": builds.names,
            "load_s": load_s, "library": _library_of(name)}
    everyone: List[Optional[dict]] = [None] * world
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        result["ranks"] = everyone
        Path(out).write_text(json.dumps(result))
    # DDP's reducer holds the group and its pending work: free it, then let every rank get here, so that
    # no rank tears its gloo pairs down while another still uses them
    del model
    gc.collect()
    dist.barrier()


def _op_name(name: str) -> str:
    return "shipped_ops" if name == SHIPPED else name


def _library_of(name: str) -> str:
    """The file the operator was imported from (warm: no build, the same module object)."""
    if name == SHIPPED:
        import shipped_pkg
        return shipped_pkg.ops.__file__
    return opbuilder.CustomOpBuilder(name, [str(SOURCE)]).load().__file__


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(steps: int = 5, world: int = 2, name: str = "ddp_ops", out: Optional[Path] = None) -> Dict[str, object]:
    """Train with ``world`` DDP ranks, then in this process alone; both results and their largest difference."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ddp.json"
        mp.spawn(_rank, args=(world, free_port(), steps, name, str(path)), nprocs=world, join=True)
        ddp = json.loads(path.read_text())
    single = train(make_model(load_ops(name)), steps)
    diff = max(abs(a - b) for a, b in zip(_flat(ddp["grads"]) + _flat(ddp["params"]),
                                          _flat(single["grads"]) + _flat(single["params"])))
    result = {"ddp": ddp, "single": single, "max_abs_diff": diff,
              "compiles": sum(r["compiles"] for r in ddp["ranks"]), "name": name}
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "ddp_result.json").write_text(json.dumps(result))
    return result


def _flat(x) -> List[float]:
    if isinstance(x, (list, tuple)):
        return [v for item in x for v in _flat(item)]
    return [float(x)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--name", default="ddp_ops", help="the operator's name (a new name: a cold build)")
    ap.add_argument("--out", type=Path, help="write ddp_result.json here")
    ap.add_argument("--shipped", action="store_true", help="use the installed examples/shipped_pkg's operator")
    args = ap.parse_args(argv)
    if args.shipped:
        args.name = SHIPPED
    res = run(args.steps, args.ranks, args.name, args.out)
    for step, (a, b) in enumerate(zip(res["ddp"]["losses"], res["single"]["losses"])):
        print(f"step {step}: loss on rank 0's rows {a:.6f}, on the whole batch (one process) {b:.6f}")
    for r in res["ddp"]["ranks"]:
        print(f"rank {r['rank']}: load() {r['load_s']:.2f} s, compiled {_op_name(args.name)} {r['compiles']} "
              f"time(s), library {r['library']}")
    print(f"compiles of {_op_name(args.name)} across ranks: {res['compiles']}")
    ok = res["max_abs_diff"] <= 1e-12
    print(f"max |DDP - single| over every step's gradients and the final parameters: {res['max_abs_diff']:.3g} "
          f"({'equal' if ok else 'DIFFERENT'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
