"""The C++ <-> Python contract has one Python owner, runtime/_native.py (issue 22).

The C++ sources (include/, src/, and C++ under runtime/) are read as text for what they use of the
runtime: the modules they import (``PyImport_ImportModule("...")``, ``ImportAttr("...", ...)``),
the names they look up on such a module (``ImportAttr``'s second argument; ``NativeFn(slot, "...")``,
which loads a runtime._native function once; ``PyObject_CallMethod`` / ``PyObject_GetAttrString`` on
the imported module object), and the attribute names they intern to
read and set on tensors and on the grad state (``PyUnicode_InternFromString("...")``). Each must be
declared by runtime._native and exist there, so a rename on the Python side fails here, not in every
built operator at run time.
"""
from __future__ import annotations

import re
import threading
import types
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
NATIVE = "runtime._native"

_IMPORT = re.compile(r'(?:(\w+)\s*=[^;]*?)?PyImport_ImportModule\(\s*"([\w.]+)"\s*\)')
_IMPORT_ATTR = re.compile(r'\bImportAttr\(\s*"([\w.]+)"\s*,\s*"(\w+)"\s*\)')
_NATIVE_FN = re.compile(r'\bNativeFn\(\s*\w+\s*,\s*"(\w+)"\s*\)')
_INTERN = re.compile(r'PyUnicode_InternFromString\(\s*"(\w+)"\s*\)')


def cxx_sources() -> Dict[str, str]:
    """path -> text of every C++ source that can reach the runtime."""
    paths = [p for d in ("include", "src", "runtime") for ext in ("*.h", "*.hpp", "*.cpp", "*.cu", "*.cuh")
             for p in (ROOT / d).rglob(ext)]
    return {str(p.relative_to(ROOT)): p.read_text() for p in sorted(paths)}


def runtime_uses(sources: Dict[str, str]) -> Tuple[Set[str], Set[Tuple[str, str]], Set[str]]:
    """(runtime modules imported, (module, name) looked up, interned attribute names) in ``sources``."""
    modules: Set[str] = set()
    names: Set[Tuple[str, str]] = set()
    interned: Set[str] = set()
    for text in sources.values():
        for m in _IMPORT.finditer(text):
            modules.add(m.group(2))
            if m.group(1):  # the module object's uses, up to the end of the enclosing function
                body = text[m.end():text.find("\n}", m.end())]
                use = re.compile(r'PyObject_(?:CallMethod|GetAttrString)\(\s*' + re.escape(m.group(1))
                                 + r'(?:\.get\(\))?\s*,\s*"(\w+)"')
                names |= {(m.group(2), u) for u in use.findall(body)}
        for mod, name in _IMPORT_ATTR.findall(text):
            modules.add(mod)
            names.add((mod, name))
        if _NATIVE_FN.search(text):
            modules.add(NATIVE)
            names |= {(NATIVE, n) for n in _NATIVE_FN.findall(text)}
        # dunder names (__dlpack__, ...) are Python protocols other frameworks' objects implement, not runtime names
        interned |= {a for a in _INTERN.findall(text) if not (a.startswith("__") and a.endswith("__"))}
    runtime = {m for m in modules if m == "runtime" or m.startswith("runtime.")}
    return runtime, {(m, n) for m, n in names if m in runtime}, interned


def contract_problems(sources: Dict[str, str], native: types.ModuleType) -> List[str]:
    """What the C++ ``sources`` use of the runtime that ``native`` (runtime._native) does not provide."""
    modules, names, interned = runtime_uses(sources)
    problems = [f"C++ imports {m}: import {NATIVE} only (export what it needs there)"
                for m in sorted(modules - {NATIVE})]
    used = {n for _, n in names}
    exported = set(native.__all__) - {"TENSOR_ATTRS", "GRAD_STATE_ATTRS", "DEVICE_NAMES"}
    problems += [f"C++ looks up {NATIVE}.{n}: not in its __all__" for n in sorted(used - exported)]
    problems += [f"{NATIVE}.__all__ has {n}, which no C++ reads" for n in sorted(exported - used)]
    problems += [f"{NATIVE} has no attribute {n}" for n in sorted(exported) if not hasattr(native, n)]
    declared = set(native.TENSOR_ATTRS) | set(native.GRAD_STATE_ATTRS)
    problems += [f"C++ interns {a!r}: not in {NATIVE}.TENSOR_ATTRS or GRAD_STATE_ATTRS"
                 for a in sorted(interned - declared)]
    problems += [f"{NATIVE} declares attribute {a!r}, which no C++ interns" for a in sorted(declared - interned)]
    return problems


def test_cxx_uses_only_what_runtime_native_declares():
    from runtime import _native
    assert contract_problems(cxx_sources(), _native) == []


def test_the_scan_sees_each_kind_of_use():
    """Each way the headers reach the runtime is found (so the check above cannot pass on nothing)."""
    modules, names, interned = runtime_uses(cxx_sources())
    assert modules == {NATIVE}
    assert {(NATIVE, "Tensor"), (NATIVE, "_state"), (NATIVE, "describe"), (NATIVE, "allocate"),
            (NATIVE, "current_stream_ptr"), (NATIVE, "torch_array")} <= names  # ImportAttr, NativeFn, GetAttr
    assert {"_data", "_node", "_version", "enabled"} <= interned


def test_declared_attributes_exist_on_tensors_and_the_grad_state():
    import runtime as rt
    from runtime import _native
    x = rt.Parameter(rt.Tensor([1.0, 2.0]))
    y = x * 2.0  # a non-leaf: its _node and _out_index are set
    for t in (rt.Tensor(1.0), x, y, x.detach()):
        for a in _native.TENSOR_ATTRS:
            assert hasattr(t, a), (type(t).__name__, a)
    assert y._node is not None and y._version == 0
    seen: List[bool] = []
    th = threading.Thread(target=lambda: seen.append(all(hasattr(_native._state, a)
                                                         for a in _native.GRAD_STATE_ATTRS)))
    th.start()
    th.join()
    assert seen == [True] and all(hasattr(_native._state, a) for a in _native.GRAD_STATE_ATTRS)


@pytest.mark.parametrize("header, problem", [
    ('r.hook = ImportAttr("runtime._native", "trace_hook2");', "C++ looks up runtime._native.trace_hook2: not in its __all__"),
    ('PyRef m = PyRef::Steal(Check(PyImport_ImportModule("runtime.tensor")));',
     "C++ imports runtime.tensor: import runtime._native only (export what it needs there)"),
    ('r.s_grad = Check(PyUnicode_InternFromString("_grad_fn"));',
     "C++ interns '_grad_fn': not in runtime._native.TENSOR_ATTRS or GRAD_STATE_ATTRS"),
])
def test_a_new_or_renamed_use_is_reported(header, problem):
    from runtime import _native
    sources = dict(cxx_sources(), **{"include/extra.h": header})
    assert contract_problems(sources, _native) == [problem]


def test_a_rename_on_the_python_side_is_reported():
    from runtime import _native
    renamed = types.ModuleType(NATIVE)
    renamed.__dict__.update({k: v for k, v in vars(_native).items() if k != "flag_address"})
    renamed.TENSOR_ATTRS = tuple("_vc" if a == "_version" else a for a in _native.TENSOR_ATTRS)
    assert contract_problems(cxx_sources(), renamed) == [
        "runtime._native has no attribute flag_address",
        "C++ interns '_version': not in runtime._native.TENSOR_ATTRS or GRAD_STATE_ATTRS",
        "runtime._native declares attribute '_vc', which no C++ interns",
    ]
