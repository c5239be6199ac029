"""Each C++ source in tests/cpp/ is built by a test that names it, and each header there is included by one
of its sources: a source no test builds is dead weight that still looks covered."""
from pathlib import Path
from typing import Iterable, List

from op_util import CPP

TESTS = Path(__file__).resolve().parent


def _unnamed(names: Iterable[str], text: str) -> List[str]:
    """The file names in ``names`` that ``text`` never spells as a string literal ("x.cpp")."""
    return sorted(n for n in names if f'"{n}"' not in text)


def test_every_cpp_source_is_named_by_a_test():
    text = "\n".join(p.read_text() for p in TESTS.rglob("*.py"))
    assert _unnamed((p.name for p in CPP.glob("*.c*")), text) == []


def test_every_cpp_header_is_included_by_a_source():
    text = "\n".join(p.read_text() for p in CPP.glob("*.c*"))
    assert _unnamed((p.name for p in CPP.glob("*.h")), text) == []


def test_the_check_reports_a_name_spelled_nowhere():
    text = 'load_op("a", [CPP / "a_ops.cpp"])'
    assert _unnamed(["a_ops.cpp", "b_ops.cpp"], text) == ["b_ops.cpp"]
