"""torch.load of a checkpoint holding a to_torch namespace, in a process that built and loaded nothing: the
namespace's nanobind module needs nanobind's runtime and the core library loaded first, as load() does
(test_torch_semantics.py saves and loads in one process, where they already are)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")

import opbuilder  # noqa: E402

from builder_util import child_env  # noqa: E402

pytestmark = pytest.mark.build  # the my_ops fixture compiles (tests/build_guard.py)


def test_a_saved_checkpoint_with_a_nanobind_namespace_loads_in_a_new_process(my_ops, tmp_path, cache_dir):
    from opbuilder.importer import recorded_needs

    needs = sorted(p.name for p in recorded_needs(Path(my_ops.__file__)))
    assert needs == ["libnanobind.so", "libobcore.so"]  # what a new process must load before the module
    saved = tmp_path / "model.pt"
    torch.save({"ops": opbuilder.to_torch(my_ops), "w": torch.ones(2)}, saved)
    code = (f"import torch; d = torch.load({str(saved)!r}, weights_only=False); "
            f"print(d['ops'].mul(torch.tensor([2.0, 5.0]), torch.tensor([3.0, 4.0])).tolist())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=child_env(OPBUILDER_CACHE_DIR=str(cache_dir)))
    assert r.stdout.strip() == "[6.0, 20.0]", r.stderr
