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
    need = "jax" if "jax" in old else "torch"
    pytest.importorskip(need, reason=f"{need} is not installed (pip install 'opbuilder[{need}]')")
    import opbuilder

    moved = importlib.import_module(new)
    monkeypatch.delitem(sys.modules, old, raising=False)  # import it afresh: the warning is given once
    monkeypatch.delattr(opbuilder, old.rpartition(".")[2], raising=False)
    with pytest.warns(DeprecationWarning) as seen:
        module = importlib.import_module(old)
    assert [str(w.message) for w in seen] == [f"{old} moved to {new}"]
    assert module is moved and sys.modules[old] is moved
    assert getattr(module, name) is getattr(moved, name)


@pytest.mark.build  # the my_ops fixture compiles (tests/build_guard.py)
def test_a_to_torch_namespace_pickled_before_the_move_loads(my_ops, tmp_path):
    """torch.save of a model holding a to_torch namespace stores ``opbuilder.interop_torch._restore``
    (protocol 2, as torch.save writes it) when made before the move; it loads in a new process."""
    import pickle
    import subprocess

    pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")
    import opbuilder

    now = pickle.dumps(opbuilder.to_torch(my_ops), protocol=2)
    assert b"copbuilder.bridges.interop_torch\n_restore\n" in now
    old = tmp_path / "old.pkl"
    old.write_bytes(now.replace(b"copbuilder.bridges.interop_torch\n", b"copbuilder.interop_torch\n"))
    code = (f"import pickle, warnings, torch; warnings.simplefilter('ignore', DeprecationWarning); "
            f"t = pickle.loads(open({str(old)!r}, 'rb').read()); "
            f"print(t.mul(torch.tensor([2.0]), torch.tensor([3.0])).item())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.stdout.strip() == "6.0", r.stderr
