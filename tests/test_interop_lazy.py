"""opbuilder imports neither torch nor jax unless to_torch / to_jax is called."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.build
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_torch_not_imported_unless_asked(cache_dir):
    code = ("import sys, opbuilder, runtime as rt\n"
            "m = opbuilder.load('my_ops', ['custom_src/function_ops.cpp'])\n"
            "m.mul(rt.Tensor(2.0), rt.Tensor(3.0))\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n"
            "assert 'jax' not in sys.modules, 'jax was imported'\n"
            "print('ok')\n")
    env = dict(os.environ, PYTHONPATH=ROOT, OPBUILDER_CACHE_DIR=str(cache_dir))
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"
