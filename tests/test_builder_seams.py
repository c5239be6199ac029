"""The builder's seams (issue 34): one retry rule for every entry point that builds something.

``load()``, ``build()`` and ``build_library()`` run their pass inside the retry loop (opbuilder/retry.py);
``core_library()`` and ``runtime_library()`` build a shared library too, and follow the same rule: a
spoiled pass (the library pruned between its lookup and its use) is run again, and after the last one
the error says what kept happening. Nothing is compiled here: each pass is spoiled before it builds.
"""
from __future__ import annotations

import pytest

from opbuilder import BuildError, CustomOpBuilder, builder
from opbuilder.importer import RUNTIME_NAME
from opbuilder.native import nanobind_runtime
from opbuilder.native.core_lib import CORE_NAME
from opbuilder.retry import MAX_PASSES, Reason, Retry

NB_SOURCE = """\
#include "opbuilder/extension.h"
OB_MODULE(m) { m.def("seven", []() { return 7; }); }
"""


@pytest.mark.parametrize("call, name", [("core_library", CORE_NAME), ("runtime_library", RUNTIME_NAME)])
def test_a_shared_library_pruned_on_every_pass_is_retried_then_a_build_error(tmp_path, monkeypatch, call, name):
    src = tmp_path / "seams_nb.cpp"
    src.write_text(NB_SOURCE)
    op = CustomOpBuilder("seams_nb", [src], build_dir=tmp_path / "cache")
    passes = []

    def pruned_every_time(spec, trusted=False):
        passes.append(spec.name)
        raise Retry(Reason.PRUNED)  # another process pruned it between our lookup and our use

    monkeypatch.setattr(builder, "_build_checked", pruned_every_time)
    monkeypatch.setattr(nanobind_runtime, "loaded", lambda: None)  # as in a process that loaded no operator
    with pytest.raises(BuildError, match=rf"^building operator '{name}' failed: its library kept being removed "
                                         r"\(cache clean, or another process pruning old builds\) between its "
                                         r"lookup and its use; load again once that is done$"):
        getattr(op, call)()
    assert passes == [name] * MAX_PASSES
