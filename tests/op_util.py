"""Where the test operators' sources are, and the one way a test builds one (into the session's cache).

conftest.py's session fixtures and the test files that build an operator of their own import these;
conftest.py is for fixtures, not for helpers to import."""
from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Iterable, Union

ROOT = Path(__file__).resolve().parents[1]
CUSTOM_SRC = ROOT / "custom_src"  # the README's and the docs' operators
CPP = Path(__file__).resolve().parent / "cpp"  # operators written for the tests
BINDINGS = ("nanobind", "pybind11")  # the binding layers a shared behaviour is checked on


def load_op(name: str, sources: Iterable[Union[str, Path]], **kw) -> ModuleType:
    """``CustomOpBuilder(name, sources, **kw).load()``: built once per session cache, then reused."""
    from opbuilder import CustomOpBuilder
    return CustomOpBuilder(name, [str(s) for s in sources], **kw).load()
