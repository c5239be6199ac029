"""A C++ operator as an XLA custom call under jax.shard_map, over 4 host devices, checked against the
unsharded run.

    python examples/jax_shard_map.py [--devices 4]

The operator is Swish with its Backward and XLA FFI handlers (examples/swish_xla_op.cpp, bound with
``OB_XLA_FFI``): ``opbuilder.to_jax`` runs it as an XLA custom call, no host callback. The loss
``sum(swish(x * w) ** 2)`` is computed with x split by rows over a 1-d mesh of host devices (each
device runs the custom call on its rows; ``psum`` adds the partial sums) and w replicated. Its value
and its gradients with respect to x and w (``jax.grad`` through ``shard_map``: the C++ Backward runs
on each device's rows) are compared with the same loss on one device, and with ``jnp`` arithmetic.

XLA makes host devices from ``--xla_force_host_platform_device_count=N`` in XLA_FLAGS, read when jax is
first imported: this script sets it before importing jax, so it must run as its own process (it does
not work once jax is imported). Prints the figures; exits 1 when they differ. ``--json`` prints them
as one JSON line instead (tests/test_distributed.py reads it).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def _set_devices(n: int) -> None:
    """XLA_FLAGS for ``n`` host devices (and the CPU platform), before jax is imported."""
    if "jax" in sys.modules:
        raise RuntimeError("examples/jax_shard_map.py: jax is already imported; XLA_FLAGS would be ignored "
                           "(run the script as its own process)")
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    os.environ["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={n}"])
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


HERE = Path(__file__).resolve().parent
SOURCE = HERE / "swish_xla_op.cpp"


def run(devices: int = 4, rows: int = 32, features: int = 6) -> dict:
    """Value and gradients of the loss, sharded over ``devices`` host devices and on one device."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import PartitionSpec as P

    sys.path.append(str(HERE.parent))  # run from a checkout without installing (an installed opbuilder comes first)
    import opbuilder

    jax.config.update("jax_enable_x64", True)
    if len(jax.devices()) != devices:
        raise RuntimeError(f"expected {devices} host devices, jax has {len(jax.devices())}: {jax.devices()}")
    ops = opbuilder.to_jax(opbuilder.CustomOpBuilder("swish_xla_ops", [str(SOURCE)],
                                                     include_paths=[jax.ffi.include_dir()]).load())
    mesh = jax.make_mesh((devices,), ("rows",))

    def loss_local(x, w):  # one device's rows of x, all of w
        return jax.lax.psum(jnp.sum(ops.swish(x * w) ** 2), "rows")

    sharded = jax.shard_map(loss_local, mesh=mesh, in_specs=(P("rows"), P()), out_specs=P())

    def loss_whole(x, w):
        return jnp.sum(ops.swish(x * w) ** 2)

    def loss_jnp(x, w):
        z = x * w
        return jnp.sum((z * jax.nn.sigmoid(z)) ** 2)

    r = np.random.default_rng(0)
    x = jnp.asarray(r.standard_normal((rows, features)))
    w = jnp.asarray(r.standard_normal(features))
    # x's rows split over the devices, w on each of them
    xs = jax.device_put(x, jax.sharding.NamedSharding(mesh, P("rows")))
    ws = jax.device_put(w, jax.sharding.NamedSharding(mesh, P()))
    grad = lambda f: jax.jit(jax.value_and_grad(f, argnums=(0, 1)))  # noqa: E731
    results = {"sharded": grad(sharded)(xs, ws), "whole": grad(loss_whole)(x, w), "jnp": grad(loss_jnp)(x, w)}
    hlo = jax.jit(jax.grad(sharded, argnums=(0, 1))).lower(xs, ws).as_text()
    out = {"devices": [str(d) for d in jax.devices()], "custom_call": ".swish.fwd" in hlo and ".swish.bwd" in hlo,
           "callback": "callback" in hlo,
           "shards": [[str(s.device), list(s.data.shape)] for s in xs.addressable_shards],
           "gx_shards": [[str(s.device), list(s.data.shape)] for s in results["sharded"][1][0].addressable_shards]}
    for name, (value, (gx, gw)) in results.items():
        out[name] = {"value": float(value), "gx": np.asarray(gx).tolist(), "gw": np.asarray(gw).tolist()}
    return out


def _max_diff(a: dict, b: dict) -> float:
    import numpy as np
    return max(float(np.max(np.abs(np.asarray(a[k]) - np.asarray(b[k])))) for k in ("value", "gx", "gw"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", type=int, default=4, help="host devices (XLA_FLAGS)")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON line")
    args = ap.parse_args(argv)
    _set_devices(args.devices)
    res = run(args.devices)
    res["max_abs_diff"] = {"sharded_vs_whole": _max_diff(res["sharded"], res["whole"]),
                           "sharded_vs_jnp": _max_diff(res["sharded"], res["jnp"])}
    ok = res["custom_call"] and not res["callback"] and res["max_abs_diff"]["sharded_vs_whole"] <= 1e-12 \
        and res["max_abs_diff"]["sharded_vs_jnp"] <= 1e-12
    if args.json:
        print(json.dumps(res))
    else:
        print(f"devices: {', '.join(res['devices'])}")
        print(f"x's rows per device: {res['shards']}")
        print(f"the gradient's HLO calls the custom call: {res['custom_call']}; a host callback: {res['callback']}")
        print(f"loss: sharded {res['sharded']['value']:.12f}, one device {res['whole']['value']:.12f}")
        for k, v in res["max_abs_diff"].items():
            print(f"max |difference| of value and gradients, {k.replace('_', ' ')}: {v:.3g}")
        print("equal" if ok else "DIFFERENT")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
