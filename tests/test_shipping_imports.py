"""A shipped operator's load() imports only what it needs (opbuilder/__init__.py): ``import opbuilder`` and the
modules a shipped load() runs import none of the build pipeline (builder.py, the toolchain, the
compile steps, the fleet stores), so a package whose wheel ships its operators starts in milliseconds
(benchmarks/ship.py, the shipped-load row). What they import is checked in a new process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from op_util import ROOT
from test_shipping import SHIPPED_PATH_MODULES

_CODE = """
import sys
had_json = "json" in sys.modules
import opbuilder
first = sorted(m for m in sys.modules if m.startswith("opbuilder"))
from opbuilder import CustomOpBuilder
from opbuilder import importer
importer.NATIVE_DIR = sys.argv[1]  # as an install writes it: native.json and its marshal copy
importer.python_api(), importer.owned_runtime()
shipped = sorted(m for m in sys.modules if m.startswith("opbuilder"))
from opbuilder.cache.json_record import loads
loads('{"a": [1]}')
json_now = "json" in sys.modules
import json
print(json.dumps({"first": first, "shipped": shipped, "json": [had_json, json_now],
                  "record": importer.owned_runtime() is not None}))
"""


def _imported(tmp_path) -> dict:
    from opbuilder.cache.shipped import record_copy
    from opbuilder.importer import NATIVE_DIR

    native = tmp_path / "_native"
    native.mkdir()
    record = json.loads((Path(NATIVE_DIR) / "native.json").read_text())
    (native / "native.json").write_text(json.dumps(record))
    (native / "native.rec").write_bytes(record_copy(record))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-c", _CODE, str(native)], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.splitlines()[-1])


def test_import_opbuilder_and_a_shipped_load_import_none_of_the_build_pipeline(tmp_path):
    got = _imported(tmp_path)
    assert got["shipped"] == SHIPPED_PATH_MODULES
    # import opbuilder is the package (which defines CustomOpBuilder) and spec.py: two modules (issue 35)
    assert got["first"] == ["opbuilder", "opbuilder.spec"]
    assert got["json"] == [False, False]  # records are read from their marshal copies, else with _json's scanner


@pytest.mark.parametrize("text", ['{"a": [1, 2.5, "x\\u00e9", null, true, false, {"b": {}}], "c": -0.0}', " [1] \n",
                                  '"s"', "3", '{"x": 1e400}'])
def test_a_record_reads_as_json_loads_reads_it(text):
    from opbuilder.cache.json_record import loads
    assert loads(text) == json.loads(text)


@pytest.mark.parametrize("text", ["", '{"a": 1} x', "{", "nope", '{"a": 1,}', "[1] [2]"])
def test_what_is_not_one_json_document_is_refused_as_json_loads_refuses_it(text):
    from opbuilder.cache.json_record import loads
    with pytest.raises(json.JSONDecodeError) as e:
        loads(text)
    with pytest.raises(json.JSONDecodeError) as want:
        json.loads(text)
    assert str(e.value) == str(want.value)


def test_a_record_broken_inside_is_a_json_error_in_a_process_without_json():
    """_json's scanner raises JSONDecodeError through json.decoder, and a SystemError where that module is not
    imported (a shipped load's process): a truncated record was a SystemError out of load(), not the error
    json.loads gives (found by this session's attack)."""
    code = ("import sys\nfrom opbuilder.cache.json_record import loads\nassert 'json.decoder' not in sys.modules\n"
            "for text in ('{\"a\": [1, 2', '{\"ops\": {\"x\": tru', '[1,]'):\n"
            "    try:\n        loads(text)\n    except ValueError as e:\n        print(type(e).__name__, e)\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["JSONDecodeError Expecting ',' delimiter: line 1 column 12 (char 11)",
                                       "JSONDecodeError Expecting value: line 1 column 15 (char 14)",
                                       "JSONDecodeError Expecting value: line 1 column 4 (char 3)"]


def test_the_public_names_are_still_there_when_asked_for():
    import opbuilder
    from opbuilder import builder, errors
    from opbuilder.native.headers import include_dir

    assert opbuilder.BuildError is errors.BuildError and opbuilder.NoBuildError is errors.NoBuildError
    assert opbuilder.build_library is builder.build_library and opbuilder.include_dir is include_dir
    from opbuilder import custom_op  # its old home still gives it
    assert opbuilder.CustomOpBuilder.__module__ == "opbuilder" and custom_op.CustomOpBuilder is opbuilder.CustomOpBuilder
    assert {"CustomOpBuilder", "build_library", "BuildError", "NoBuildError", "include_dir"} <= set(opbuilder.__all__)


def test_the_toolchains_python_abi_is_the_one_abi_writes_out(monkeypatch):
    from opbuilder.native import abi
    from opbuilder.tools.toolchain import python_abi

    monkeypatch.setenv("OPBUILDER_LIMITED_API", "0")  # on 3.11 always; on >= 3.12 the full API's
    assert abi.python_api() == python_abi()
