"""Modules users imported by path before opbuilder/ was grouped by stage (docs/interop.md named
``opbuilder.interop_torch.op_handle`` and ``opbuilder.torch_bridge.status()``) still import: each old
path is the moved module itself, with a DeprecationWarning naming the new path."""
import importlib
import sys

import pytest

MOVED = [("opbuilder.interop_torch", "opbuilder.bridges.interop_torch", "op_handle"),
         ("opbuilder.torch_bridge", "opbuilder.bridges.torch_bridge", "status"),
         ("opbuilder.interop_jax", "opbuilder.bridges.interop_jax", "to_jax")]


@pytest.mark.parametrize("old, new, name", MOVED, ids=[m[0] for m in MOVED])
def test_an_old_module_path_is_the_moved_module_with_a_warning(old, new, name, monkeypatch):
    pytest.importorskip("jax" if "jax" in old else "torch")
    import opbuilder

    moved = importlib.import_module(new)
    monkeypatch.delitem(sys.modules, old, raising=False)  # import it afresh: the warning is given once
    monkeypatch.delattr(opbuilder, old.rpartition(".")[2], raising=False)
    with pytest.warns(DeprecationWarning) as seen:
        module = importlib.import_module(old)
    assert [str(w.message) for w in seen] == [f"{old} moved to {new}"]
    assert module is moved and sys.modules[old] is moved
    assert getattr(module, name) is getattr(moved, name)
