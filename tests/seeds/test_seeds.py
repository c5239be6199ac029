"""The seeds' Python scripts (tests/seeds/seed_*.py) run as scripts, each in a fresh process, from the
repository root as the seeds run from their project folder; their printed output is the seeds'."""
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import runtime as rt
from builder_util import child_env
from runtime import Tensor

pytestmark = pytest.mark.build  # every test here compiles, some in child processes (tests/build_guard.py)

ROOT = Path(__file__).resolve().parents[2]
SEEDS = Path(__file__).resolve().parent
SEED_003_CPP = SEEDS / "seed_003" / "custom_src" / "function_ops.cpp"
# The seed documents (MindSpore's tutorials as text), where this checkout sits beside them.
SEED_DOCS = ROOT.parent / "shared" / "seeds"


def _torch_importable() -> bool:
    try:
        import torch  # noqa: F401
    except Exception:  # not installed, or installed without the libraries it needs
        return False
    return True


def run_seed(name: str, cwd: Path = ROOT) -> str:
    """Run one seed script (with the session's cache) from ``cwd``; its stdout."""
    res = subprocess.run([sys.executable, str(SEEDS / name)], cwd=cwd, env=child_env(), capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, f"{name} exited {res.returncode}\n{res.stderr}"
    return res.stdout


@pytest.mark.skipif(not _torch_importable(),
                    reason="seed 002 calls PyTorch ATen: torch cannot be imported (pip install torch)")
def test_seed_002_aten_leaky_relu():
    # the seed prints numpy's layout of [[0, -0.001], [-0.002, 1]] (its web page collapsed the spaces)
    assert run_seed("seed_002_aten_leaky_relu.py") == "[[ 0.    -0.001]\n [-0.002  1.   ]]\n"


def test_seed_003_custom_op_builder():
    # run from its project folder, whose custom_src/function_ops.cpp is the seed's own C++ (aclnnMul and all)
    assert run_seed("seed_003/seed_003_custom_op_builder.py", cwd=SEEDS / "seed_003") == (
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


def web_page_text(cpp: str) -> str:
    """C++ as the seed's web page shows it: whitespace collapsed, and every <...> that starts with a letter
    (an #include's name, a template's arguments) taken for an HTML tag and dropped."""
    return " ".join(re.sub(r"<[A-Za-z][^<>]*>", "", cpp).split())


def test_seed_003_source_is_the_seeds_code_block():
    # the stored source is the seed's, with only what the web page lost put back: <string>, <CustomMul>,
    # <BaseTensor> (three times); function_ops.seed.txt is the seed's code block exactly as it reads there
    block = (SEEDS / "seed_003" / "function_ops.seed.txt").read_text().rstrip("\n")
    src = SEED_003_CPP.read_text()
    assert web_page_text(src) == block
    assert re.findall(r"<[A-Za-z][^<>]*>", src) == ["<string>", "<CustomMul>"] + ["<BaseTensor>"] * 3
    docs = sorted(SEED_DOCS.glob("003_*.txt"))
    if docs:  # the seed document itself, where it can be read: the block is in it verbatim
        assert "```cpp " + block + " ```" in docs[0].read_text()


@pytest.fixture(scope="session")
def seed_003_ops(cache_dir):
    from opbuilder import CustomOpBuilder
    return CustomOpBuilder("seed_003_ops", [str(SEED_003_CPP)], backend="CPU").load()


@pytest.mark.parametrize("sx,sy", [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((3, 1), (1, 5)), ((), (2, 2))])
def test_seed_003_mul_gradients_match_numerical(seed_003_ops, sx, sy):
    rng = np.random.default_rng(19)
    x, y = Tensor(rng.standard_normal(sx)), Tensor(rng.standard_normal(sy))
    np.testing.assert_array_equal(seed_003_ops.mul(x, y).asnumpy(), x.asnumpy() * y.asnumpy())
    assert rt.gradcheck(seed_003_ops.mul, [x, y])


@pytest.mark.parametrize("dtype", ["float32", "float16", "int32"])
def test_seed_003_mul_in_other_dtypes(seed_003_ops, dtype):
    x, y = np.array([[1, -2, 3]], dtype), np.array([[4], [5]], dtype)
    out = seed_003_ops.mul(Tensor(x), Tensor(y)).asnumpy()
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, x * y)


def test_seed_003_mul_of_shapes_that_do_not_broadcast(seed_003_ops):
    # the seed's BroadcastInferShape does not check; aclnnMul does
    with pytest.raises(ValueError, match=r"^aclnnMul: shapes \[2\] and \[3\] cannot be broadcast together$"):
        seed_003_ops.mul(Tensor(np.ones(2)), Tensor(np.ones(3)))
