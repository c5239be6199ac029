"""Beyond one process (issue 35, item 6): torch DDP over 2 gloo ranks through a to_torch operator gives the
gradients of a one-process run, and ranks sharing one cache compile the operator once; an XLA FFI
operator under jax.shard_map over 4 host devices gives the values and gradients of the unsharded run.

Each runs its example (examples/ddp_train.py, examples/jax_shard_map.py) as a new process, on the
session's cache (OPBUILDER_CACHE_DIR): host devices need XLA_FLAGS before jax is imported, and DDP
ranks are processes."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from builder_util import child_env
from op_util import CPP, ROOT
from ship_util import NO_CXX, shipped_site, wheel_env

pytestmark = pytest.mark.build  # each example builds its operator (in the session's cache)

EXAMPLES = ROOT / "examples"
FAULTS = {"PYTHONFAULTHANDLER": "1"}  # a rank that aborts prints each thread's Python stack (the ranks inherit it)


def _run(args, timeout=600, **env):
    res = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                         env=child_env(**env), cwd=str(ROOT))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res


def test_ddp_gradients_equal_one_process_and_the_ranks_compile_once(tmp_path, cache_dir):
    pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")
    name = "ddp_cold_ops"  # a name no other test builds: a cold build in the session's cache
    assert not (cache_dir / name).exists()
    res = _run([EXAMPLES / "ddp_train.py", "--steps", "4", "--name", name, "--out", tmp_path], CI="1",
               OPBUILDER_TORCH_BRIDGE="0", OPBUILDER_CACHE_DIR=str(cache_dir), **FAULTS)
    out = json.loads((tmp_path / "ddp_result.json").read_text())
    ddp, single = out["ddp"], out["single"]
    assert len(ddp["grads"]) == len(single["grads"]) == 4
    for step, (dg, sg) in enumerate(zip(ddp["grads"], single["grads"])):
        for d, s in zip(dg, sg):  # gate, linear.weight, linear.bias: all-reduced over the ranks
            assert np.abs(np.asarray(s)).max() > 1e-3, f"step {step}: a zero gradient checks nothing"
            np.testing.assert_allclose(np.asarray(d), np.asarray(s), rtol=1e-12, atol=1e-14)
    for d, s in zip(ddp["params"], single["params"]):
        np.testing.assert_allclose(np.asarray(d), np.asarray(s), rtol=1e-12, atol=1e-14)
    # each rank saw only its half of each batch: its loss is not the whole batch's
    assert ddp["losses"][0] != pytest.approx(single["losses"][0], rel=1e-6)
    ranks = sorted(ddp["ranks"], key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == [0, 1]
    assert sum(r["compiles"] for r in ranks) == 1, ranks  # one rank compiled, the other waited and imported
    assert len({r["library"] for r in ranks}) == 1 and str(cache_dir) in ranks[0]["library"]
    assert res.stderr.count(f"opbuilder: built {name} in") == 1, res.stderr
    assert f"compiles of {name} across ranks: 1" in res.stdout


def test_ddp_with_the_shipped_operator_builds_nothing(tmp_path, cache_dir):
    """examples/shipped_pkg installed from its wheel: both ranks load its binary with no compiler, and
    training through it gives the one-process gradients."""
    pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")
    site = shipped_site(cache_dir.parent)
    empty = tmp_path / "cache"  # a load that built or wrote would make it
    res = subprocess.run([sys.executable, str(EXAMPLES / "ddp_train.py"), "--shipped", "--steps", "3", "--out",
                          str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=str(tmp_path),
                         env=wheel_env(site, {**NO_CXX, "CI": "1", "OPBUILDER_NO_BUILD": "1",
                                              "OPBUILDER_TORCH_BRIDGE": "0", "OPBUILDER_CACHE_DIR": str(empty), **FAULTS}))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = json.loads((tmp_path / "ddp_result.json").read_text())
    for dg, sg in zip(out["ddp"]["grads"], out["single"]["grads"]):
        for d, s in zip(dg, sg):
            assert np.abs(np.asarray(s)).max() > 1e-3
            np.testing.assert_allclose(np.asarray(d), np.asarray(s), rtol=1e-12, atol=1e-14)
    for d, s in zip(out["ddp"]["params"], out["single"]["params"]):
        np.testing.assert_allclose(np.asarray(d), np.asarray(s), rtol=1e-12, atol=1e-14)
    ranks = out["ddp"]["ranks"]
    assert [r["compiles"] for r in ranks] == [0, 0] and not any(r["all_builds"] for r in ranks)
    assert all(r["library"].startswith(str(site)) for r in ranks), ranks  # the wheel's binary
    assert not empty.exists()


def _jax():
    return pytest.importorskip("jax", reason="jax is not installed (pip install 'opbuilder[jax]')")


def test_ffi_op_under_shard_map_over_4_devices_equals_the_unsharded_run(cache_dir):
    _jax()
    res = _run([EXAMPLES / "jax_shard_map.py", "--devices", "4", "--json"], OPBUILDER_CACHE_DIR=str(cache_dir))
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["devices"] == ["cpu:0", "cpu:1", "cpu:2", "cpu:3"]
    assert sorted(d for d, _ in out["shards"]) == out["devices"] and {tuple(s) for _, s in out["shards"]} == {(8, 6)}
    assert sorted(d for d, _ in out["gx_shards"]) == out["devices"]  # x's gradient stays split by rows
    assert out["custom_call"] and not out["callback"]  # the XLA FFI handlers, not a host callback
    for other in ("whole", "jnp"):
        for k in ("value", "gx", "gw"):
            np.testing.assert_allclose(np.asarray(out["sharded"][k]), np.asarray(out[other][k]), rtol=1e-12, atol=1e-14)
    assert np.abs(np.asarray(out["sharded"]["gw"])).max() > 1e-3


MIXED = """
import json, sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
jax.config.update("jax_enable_x64", True)
import opbuilder
from opbuilder import Spec
m = opbuilder.CustomOpBuilder("xla_ffi_ops", [sys.argv[1]], include_paths=[jax.ffi.include_dir()],
                              cflags=["-Wall", "-Wextra", "-Werror"], binding="nanobind").load()
ops = opbuilder.to_jax(m, shape_fn={"square": lambda x: Spec(x.shape, x.dtype),
                                    "positions": lambda x: Spec(x.shape, np.int64)})
mesh = jax.make_mesh((4,), ("rows",))
r = np.random.default_rng(0)
x, w = r.standard_normal((8, 3)), r.standard_normal((2, 3))
xs, ws = jax.device_put(x, NamedSharding(mesh, P("rows"))), jax.device_put(w, NamedSharding(mesh, P()))
# mul(x's 2 rows on a device, w on every device): w is invariant over the mesh, x varies
loss = jax.shard_map(lambda a, b: jax.lax.psum(jnp.sum(ops.mul(a, b) ** 2), "rows"), mesh=mesh,
                     in_specs=(P("rows"), P()), out_specs=P())
v, (gx, gw) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(xs, ws)
print(json.dumps({"value": float(v), "gx": np.asarray(gx).tolist(), "gw": np.asarray(gw).tolist(),
                  "hlo_ffi": ".mul.bwd" in jax.jit(jax.grad(loss)).lower(xs, ws).as_text()}))
"""


def test_shard_map_gradient_of_an_ffi_op_with_a_replicated_input(cache_dir):
    """An invariant (replicated) input next to a varying one: the call's results vary over the mesh, and
    the replicated input's gradient is the sum over the devices (fails on 2d5c965: custom_vjp's type
    check refused the gradient, "the manual axis types do not match")."""
    _jax()
    res = _run(["-c", MIXED, CPP / "xla_ffi_ops.cpp"], OPBUILDER_CACHE_DIR=str(cache_dir),
               XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    out = json.loads(res.stdout.strip().splitlines()[-1])
    r = np.random.default_rng(0)
    x, w = r.standard_normal((8, 3)), r.standard_normal((2, 3))
    xr = x.reshape(4, 2, 3)  # device d holds rows 2d, 2d+1
    assert out["value"] == pytest.approx(float(np.sum((xr * w) ** 2)), rel=1e-12)
    np.testing.assert_allclose(np.asarray(out["gx"]), (2 * xr * w ** 2).reshape(8, 3), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(np.asarray(out["gw"]), np.sum(2 * xr ** 2 * w, axis=0), rtol=1e-12, atol=1e-14)
    assert out["hlo_ffi"]
