"""The warm record (opbuilder/warm.py): a load() in a new process whose build is in the cache checks
stat stamps, imports none of the build pipeline, and still sees every edit (a source, a header, one
that keeps the size and puts the mtime back), a changed environment and a tampered library."""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from builder_util import run_python, tiny_module
from opbuilder import warm
from opbuilder.cache import warm_notes

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)

# a new process loads the operator; prints its value and whether the build pipeline was imported
LOAD = """
import json, sys
from opbuilder import CustomOpBuilder
m = CustomOpBuilder(sys.argv[1], [sys.argv[2]], include_paths=sys.argv[3:], build_dir=sys.argv[2] + ".cache").load()
print(json.dumps({"value": m.value(), "builder": "opbuilder.builder" in sys.modules}))
"""


def _load(name: str, src: Path, *includes: str, **env: str) -> dict:
    res = run_python(LOAD, name, str(src), *includes, **env)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.splitlines()[-1])


def _warmed(name: str, src: Path, *includes: str) -> dict:
    """Build, wait for the files to settle (warm_notes.SETTLE_NS), load once more to write the record."""
    first = _load(name, src, *includes)
    time.sleep(warm_notes.SETTLE_NS * 2 / 1e9)
    _load(name, src, *includes)
    return first


@pytest.fixture
def op(tmp_path):
    """A built operator whose warm record is written: its source, and its header v.h in inc/, found
    through an include path that searches first/ (empty) before inc/."""
    header = tmp_path / "inc" / "v.h"
    header.parent.mkdir()
    (tmp_path / "first").mkdir()
    header.write_text("#define OB_V 1\n")
    src = tiny_module(tmp_path / "wr_op.cpp", "OB_V*1", includes='#include "v.h"')
    assert _warmed("wr_op", src, *_includes(header))["value"] == 1
    return src, header


def _includes(header: Path) -> list:
    return [str(header.parent.parent / "first"), str(header.parent)]


def test_a_warm_load_in_a_new_process_imports_no_build_pipeline(op):
    src, header = op
    assert _load("wr_op", src, *_includes(header)) == {"value": 1, "builder": False}


def test_a_source_edit_that_keeps_size_and_mtime_is_seen(op):
    src, header = op
    st = os.stat(src)
    text = src.read_text()
    src.write_text(text.replace("OB_V*1", "OB_V+1"))
    assert os.stat(src).st_size == st.st_size
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))  # the mtime put back: only the ctime moved
    assert _load("wr_op", src, *_includes(header)) == {"value": 2, "builder": True}


def test_a_header_edit_of_the_same_size_is_seen(op):
    src, header = op
    st = os.stat(header)
    header.write_text("#define OB_V 5\n")
    os.utime(header, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert _load("wr_op", src, *_includes(header)) == {"value": 5, "builder": True}


def test_a_header_created_earlier_on_the_include_path_is_seen(op, tmp_path):
    src, header = op
    (tmp_path / "first" / "v.h").write_text("#define OB_V 9\n")  # found before inc/v.h from now on
    assert _load("wr_op", src, *_includes(header)) == {"value": 9, "builder": True}


def test_an_environment_the_lookup_reads_changes_the_record(op, tmp_path):
    src, header = op
    got = _load("wr_op", src, *_includes(header), CPLUS_INCLUDE_PATH=str(tmp_path))
    assert got == {"value": 1, "builder": True}  # another identity: the full lookup, no record of it yet


def test_a_tampered_library_is_not_loaded_from_the_record(op):
    src, header = op
    cache = Path(str(src) + ".cache") / "wr_op"
    lib = next(p for p in cache.glob("*/wr_op*.so") if p.parent.name != "build")  # the published one
    data = bytearray(lib.read_bytes())
    data[-1] ^= 0xFF
    st = os.stat(lib)
    lib.write_bytes(bytes(data))
    os.utime(lib, ns=(st.st_atime_ns, st.st_mtime_ns))
    got = _load("wr_op", src, *_includes(header))
    assert got == {"value": 1, "builder": True}  # the full lookup hashed it, and built it again
    assert lib.read_bytes() != bytes(data) or not lib.exists()


def test_every_variable_opbuilder_reads_is_in_the_identity_or_changes_no_lookup():
    """A variable read by the lookup but missing from warm.ENV_NAMES would let a record serve another
    toolchain: every name read in opbuilder's source is OPBUILDER_*, listed, or known to change no lookup."""
    from opbuilder.tools.toolchain import COMPILER_ENV
    assert set(COMPILER_ENV) <= set(warm.ENV_NAMES)
    no_lookup = {"TMPDIR", "MAX_JOBS", "PYTEST_XDIST_WORKER"}  # temporary files, build jobs
    root = Path(warm.__file__).resolve().parent  # opbuilder/
    names = set()
    for path in root.rglob("*.py"):
        text = path.read_text()
        names |= set(re.findall(r"environ(?:\.get)?[\[(]\s*[\"']([A-Z][A-Z0-9_]*)[\"']", text))
        names |= set(re.findall(r"getenv\(\s*[\"']([A-Z][A-Z0-9_]*)[\"']", text))
    missing = sorted(n for n in names if not n.startswith("OPBUILDER_") and n not in warm.ENV_NAMES
                     and n not in no_lookup)
    assert missing == []


def test_a_record_that_names_another_library_to_preload_is_not_used(op, tmp_path):
    """A record can make load() preload only opbuilder's own libraries (the installed runtime, or the
    runtime and core library in this cache), as build.json's "needs" can (importer.recorded)."""
    import marshal
    import shutil

    from opbuilder.cache.trust import stamp_of, write_file
    src, header = op
    records = Path(str(src) + ".cache") / "wr_op" / warm.RECORDS
    fmt, data = marshal.loads(records.read_bytes())
    other = tmp_path / "other.so"
    shutil.copy(next(p for p in records.parent.glob("*/wr_op*.so") if p.parent.name != "build"), other)
    data = {k: marshal.dumps((*marshal.loads(v)[:4], [[str(other), stamp_of(os.lstat(other))]]))
            for k, v in data.items()}
    write_file(records, marshal.dumps((fmt, data)))
    assert _load("wr_op", src, *_includes(header)) == {"value": 1, "builder": True}
