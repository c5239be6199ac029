"""include/ holds short public headers, API first, with the details in include/opbuilder/detail/ (issue 34).

The core library's function bodies are sources in src/core/, compiled once into libobcore (or inline,
included by their header's last lines, where there is no core library); the torch bridge is
src/torch_bridge.cpp. Nothing under include/ is a source file, and no header keeps bodies behind a
preprocessor switch. Read as text: nothing compiles here.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INCLUDE = ROOT / "include"
MAX_LINES = 400  # a public header is read whole: under this many lines
FUNCTION_WITHIN = 300  # autograd.h's first lines: Function<T> is there, not below its machinery


def public_headers() -> list:
    """The headers an operator author includes or reads: every header under include/ but those in a
    detail/ directory (opbuilder/*.h, ms_extension.h and MindSpore's compatibility headers)."""
    return sorted(p for p in INCLUDE.rglob("*.h") if "detail" not in p.relative_to(INCLUDE).parts)


def test_every_public_header_is_under_400_lines():
    assert len(public_headers()) >= 10
    long = {str(p.relative_to(INCLUDE)): n for p in public_headers() if (n := len(p.read_text().splitlines())) >= MAX_LINES}
    assert long == {}, f"public headers of {MAX_LINES}+ lines (move their details to a detail/ directory)"


def test_no_source_file_is_under_include():
    sources = [str(p.relative_to(ROOT)) for p in INCLUDE.rglob("*") if p.suffix in (".cpp", ".cc", ".cxx", ".cu")]
    assert sources == []


def test_no_header_keeps_bodies_behind_a_switch():
    switched = [str(p.relative_to(ROOT)) for p in INCLUDE.rglob("*.h") if "OB_CORE_BODIES" in p.read_text()]
    assert switched == []


def test_function_is_declared_in_the_first_300_lines_of_autograd_h():
    lines = (INCLUDE / "opbuilder" / "autograd.h").read_text().splitlines()
    at = [i + 1 for i, line in enumerate(lines)
          if re.match(r"class Function\b", line) and i > 0 and lines[i - 1].startswith("template <typename")]
    assert at and at[0] <= FUNCTION_WITHIN, f"template <...> class Function at line {at}"


def test_the_core_sources_are_outside_include_and_each_header_includes_its_own():
    """Each src/core/<name>.cpp holds the bodies its header declares; built without the core library
    (pybind11, sanitizers, CUDA), the header includes it at its end by a path relative to itself."""
    core = ROOT / "src" / "core"
    assert (core / "core_lib.cpp").is_file() and (ROOT / "src" / "torch_bridge.cpp").is_file()
    bodies = sorted(p for p in core.glob("*.cpp") if p.name != "core_lib.cpp")
    assert bodies
    combined = (core / "core_lib.cpp").read_text()
    for body in bodies:
        assert f'#include "{body.name}"' in combined, body.name  # compiled once into libobcore
        owner = re.search(r'#include "(opbuilder/[\w/]+\.h)"', body.read_text()).group(1)
        header = INCLUDE / owner
        depth = "../" * len(Path(owner).parts)
        assert f'#include "{depth}src/core/{body.name}"' in header.read_text(), owner


def test_an_edit_of_a_core_body_changes_the_digest_every_key_holds(tmp_path, monkeypatch):
    """The bodies left the headers, not the keys: headers_digest (in every operator's key, the core
    library's tag and the precompiled header's key) covers src/core/, also when it is remembered."""
    import shutil

    import opbuilder.native.headers as headers

    shutil.copytree(INCLUDE, tmp_path / "include")
    shutil.copytree(ROOT / "src", tmp_path / "src")
    monkeypatch.setattr(headers, "_include_dir", tmp_path / "include")
    monkeypatch.setattr(headers, "_source_dir", tmp_path / "src")
    state = tmp_path / "state"
    state.mkdir()
    before = headers.headers_digest(state)
    assert headers.headers_digest(state) == before == headers.headers_digest(None)
    body = tmp_path / "src" / "core" / "tensor.cpp"
    body.write_text(body.read_text() + "// edited\n")
    edited = headers.headers_digest(state)
    assert edited != before and edited == headers.headers_digest(None)
    (tmp_path / "src" / "core" / "extra.cpp").write_text("// a new body file\n")
    assert headers.headers_digest(state) not in (before, edited)
