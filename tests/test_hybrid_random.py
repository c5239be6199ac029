"""Random-ish DSL programs (a fixed seed): each of many random expressions over two tensors, the loop index,
a loop-carried scalar and constants is one row of the output; the compiled kernel and the Python target agree
on every element. One kernel per dtype, so one compile each."""
import importlib.util
import random

import numpy as np
import pytest

from runtime import Tensor, ops

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)

ROWS = 24


def _expr(rng: random.Random, depth: int, floats: bool) -> str:
    leaves = ["a[i]", "b[i]", "a[n - 1 - i]", "i", "acc", "3", "-2", "b[i - 1]"] + (["0.5", "-1.25"] if floats else [])
    if depth == 0 or rng.random() < 0.25:
        return rng.choice(leaves)
    x, y = _expr(rng, depth - 1, floats), _expr(rng, depth - 1, floats)
    forms = ["({x} + {y})", "({x} - {y})", "({x} * {y})", "max({x}, {y})", "min({x}, {y}, 1)", "abs({x})",
             "({x} if {x} > {y} else {y})", "({x} // (abs({y}) + 1))", "({x} % (abs({y}) + 1))", "(-{x})"]
    if floats:
        forms += ["sqrt(abs({x}))", "({x} / (abs({y}) + 1))", "tanh({x})", "floor({x})", "fmod({x}, abs({y}) + 1)"]
    else:
        forms += ["({x} & {y})", "({x} ^ {y})", "(({x} >> 1) | {y})", "int32({x} < {y})"]
    return rng.choice(forms).format(x=x, y=y)


def _module(tmp_path, floats: bool):
    rng = random.Random(1234 + floats)
    lines = ["from runtime.hybrid import kernel", "", "", "@kernel", "def rand_prog(a, b):",
             "    n = a.shape[0]", f"    out = output_tensor(({ROWS}, n), a.dtype)", "    acc = a[0] * 0",
             "    for i in range(n):"]
    for r in range(ROWS):
        lines.append(f"        out[{r}, i] = {_expr(rng, 3, floats)}")
    lines.append("        acc = acc + b[i] - a[i] // 2" if not floats else "        acc = acc * 0.5 + b[i]")
    lines.append("    return out")
    name = f"hybrid_rand_{'f' if floats else 'i'}"
    path = tmp_path / f"{name}.py"
    path.write_text("\n".join(lines) + "\n")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.rand_prog


@pytest.mark.parametrize("dtype", ["int32", "float64"])
def test_random_programs_agree_between_targets(tmp_path, dtype):
    floats = dtype != "int32"
    k = _module(tmp_path, floats)
    rng = np.random.default_rng(5)
    n = 17
    a = (rng.standard_normal(n) * 4 if floats else rng.integers(-50, 50, n)).astype(dtype)
    b = (rng.standard_normal(n) * 4 if floats else rng.integers(-50, 50, n)).astype(dtype)
    want = k(a, b)
    got = ops.Custom(k)(Tensor(a), Tensor(b)).asnumpy()
    assert got.dtype == want.dtype and got.shape == want.shape == (ROWS, n)
    for r in range(ROWS):
        np.testing.assert_allclose(got[r], want[r], rtol=1e-12, atol=1e-12, err_msg=f"row {r}")
