"""The seeds' Python scripts (tests/seeds/seed_*.py) run as scripts, each in a fresh process, from the
repository root as the seeds run from their project folder; their printed output is the seeds'."""
import subprocess
import sys
from pathlib import Path

import pytest

from builder_util import child_env

ROOT = Path(__file__).resolve().parents[2]
SEEDS = Path(__file__).resolve().parent


def _torch_importable() -> bool:
    try:
        import torch  # noqa: F401
    except Exception:  # not installed, or installed without the libraries it needs
        return False
    return True


def run_seed(name: str) -> str:
    """Run one seed script (with the session's cache); its stdout."""
    res = subprocess.run([sys.executable, str(SEEDS / name)], cwd=ROOT, env=child_env(), capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, f"{name} exited {res.returncode}\n{res.stderr}"
    return res.stdout


@pytest.mark.skipif(not _torch_importable(),
                    reason="seed 002 calls PyTorch ATen: torch cannot be imported (pip install torch)")
def test_seed_002_aten_leaky_relu():
    # the seed prints numpy's layout of [[0, -0.001], [-0.002, 1]] (its web page collapsed the spaces)
    assert run_seed("seed_002_aten_leaky_relu.py") == "[[ 0.    -0.001]\n [-0.002  1.   ]]\n"


def test_seed_003_custom_op_builder():
    assert run_seed("seed_003_custom_op_builder.py") == (
        "out: 12.0\n"
        "grads[0]: (Tensor(shape=[], dtype=Float32, value= 6), Tensor(shape=[], dtype=Float32, value= 4))\n"
        "grads[1]: (Tensor(shape=[], dtype=Float32, value= 6),)\n")


def test_seed_004_custom_add_printed_by_print_():
    assert run_seed("seed_004_custom_add.py") == (
        "Tensor(shape=[3], dtype=Float32, value= [ 4.00000000e+00,  4.00000000e+00,  4.00000000e+00])\n")


def test_seed_004_custom_add_with_a_cell_bprop():
    res, res_g = run_seed("seed_004_custom_add_bprop.py").splitlines()
    assert res == "[4. 4. 4.]"
    # as the seed prints: grad with a one-element grad_position gives the gradient itself
    assert res_g == "[3. 2. 1.]"


def test_seed_001_hybrid_square_with_a_hybrid_bprop():
    # GRAPH_MODE, two func_type="akg" DSL kernels compiled by runtime.hybrid; the gradient 2 * x * dout
    assert run_seed("seed_001_hybrid_grad.py") == "[ 2.  8. 18.]\n"


def test_seed_000_custom_backend_plugin():
    # the seed's plugin, its two defects fixed, built with build_library, registered and used by jit; its
    # MS_LOG(WARNING) lines go to stderr, once for the one build and once for the one run
    res = subprocess.run([sys.executable, str(SEEDS / "seed_000_custom_backend.py")], cwd=ROOT, env=child_env(),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "[[0.841471 0.841471]\n [0.841471 0.841471]]\n[[1. 1.]\n [1. 1.]]\n"
    logs = [line for line in res.stderr.splitlines() if line.startswith("[")]
    assert [line.split("] ", 1)[0] for line in logs] == ["[WARNING", "[WARNING"]
    assert logs[0].endswith("Build] MSCustomBackendBase use the origin ms_backend to build the graph.")
    assert logs[1].endswith("Run] MSCustomBackendBase use the origin ms_backend to run the graph.")
