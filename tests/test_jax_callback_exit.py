"""The JAX callback route (``to_jax(..., ffi=False)``) leaves no callback in flight (issue 33).

``jax.jacfwd`` of a ``custom_vjp`` runs its forward eagerly, then raises JAX's TypeError and drops
the forward's result. That result was an XLA program not yet run; it ran its Python callback at
interpreter exit, on XLA's thread, and the process aborted ("terminate called without an active
exception", rc 134). A child process runs the scenario: its exit status is the test."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import opbuilder

pytest.importorskip("jax", reason="jax is not installed (pip install 'opbuilder[jax]')")

from op_util import CUSTOM_SRC  # noqa: E402

# argv: the operator's source, the steps ("grad" or "fwd", comma-separated), the arrays' rows
CHILD = r"""
import sys
import numpy as np, jax, jax.numpy as jnp
import opbuilder
from opbuilder import CustomOpBuilder
j = opbuilder.to_jax(CustomOpBuilder("my_ops", [sys.argv[1]]).load(), ffi=False)
r = np.random.default_rng(0)
x, y = (jnp.asarray(r.standard_normal((int(sys.argv[3]), 96)), jnp.float32) for _ in range(2))
for step in sys.argv[2].split(","):
    try:
        if step == "grad":
            g = jax.grad(lambda b: (j.mul(b, y) ** 2).sum())(x)
            assert np.allclose(np.asarray(g), 2 * np.asarray(x) * np.asarray(y) ** 2, rtol=1e-5)
        else:
            jax.jacfwd(lambda b: j.mul(b, y).sum())(x)
        print(step, "ok")
    except TypeError as e:
        print(step, "TypeError:", e)
print("end", flush=True)
"""

FWD = "fwd TypeError: can't apply forward-mode autodiff (jvp) to a custom_vjp function."


@pytest.mark.parametrize("steps", ["fwd,fwd", "grad,fwd,fwd"])
def test_exit_after_jax_drops_an_eager_callback(my_ops, cache_dir, tmp_path, steps):
    # the child imports the opbuilder this session tests (not one its working directory would give)
    path = os.pathsep.join(p for p in (str(Path(opbuilder.__file__).parents[1]), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, OPBUILDER_CACHE_DIR=str(cache_dir), PYTHONPATH=path)
    # 32 x 96 float32 arrays: the smallest that aborted on every run before the fix (16 rows: some runs)
    done = subprocess.run([sys.executable, "-c", CHILD, str(CUSTOM_SRC / "function_ops.cpp"), steps, "32"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    want = ["grad ok" if s == "grad" else FWD for s in steps.split(",")] + ["end"]
    assert (done.returncode, done.stdout.splitlines()) == (0, want), done.stderr[-3000:]
