"""Which binding library a module's sources use: pybind11 or nanobind, read from the sources.

A source set is nanobind when a source defines its module with ``OB_MODULE(m)`` or ``NB_MODULE(...)``
(or includes ``<nanobind/...>``), and pybind11 when one uses ``PYBIND11_MODULE(...)`` (or includes
``<pybind11/...>`` or ``ms_extension.h``). Comments and string literals are skipped, so a comment
that mentions a macro decides nothing. Sources that mention both are an error: the builder never
guesses which of the two a module needs. Sources that mention neither (a module written on the
plain Python C API, or one whose module macro is in a header) build as they always did, on the
pybind11 path; a nanobind module in a header would fail to compile there (nanobind's headers
are not on that path), never load wrongly.

One pybind11 case is built with nanobind: code written for ``ms_extension.h`` whose module only binds
plain functions (``m.def("mul", &fn, "doc")``) of argument types both layers convert alike, as
ms_module.py decides (strictly: anything else stays on pybind11). ``why_pybind11`` says why a source
set was not.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Optional, Sequence, Tuple

from .errors import BuildError

if TYPE_CHECKING:
    from .ms_module import FileFacts

__all__ = ["PYBIND11", "NANOBIND", "binding_of_text", "detect_binding", "from_pybind11", "why_pybind11"]

PYBIND11 = "pybind11"
NANOBIND = "nanobind"

# comments and literals (kept apart so that a quote inside a comment or a // inside a string is skipped whole)
_SKIP = re.compile(r'//[^\n]*|/\*.*?\*/|R"([^(\s]{0,16})\(.*?\)\1"|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'',
                   re.S)
_NB_MODULE = re.compile(r"\b(?:OB_MODULE|NB_MODULE)\s*\(")
_PB_MODULE = re.compile(r"\bPYBIND11_MODULE\s*\(")
_NB_INCLUDE = re.compile(r'#\s*include\s*<nanobind/')
_PB_INCLUDE = re.compile(r'#\s*include\s*(?:<pybind11/|"ms_extension\.h"|<ms_extension\.h>)')
_memo: Dict[Tuple[str, bytes], Tuple[bool, bool, bool, bool]] = {}
_facts_memo: Dict[Tuple[str, bytes], "FileFacts"] = {}


def _strip(text: str, literals: bool) -> str:
    """``text`` without comments; with string and character literals emptied too if ``literals``."""
    def sub(m: "re.Match[str]") -> str:
        t = m.group(0)
        if t.startswith("/"):
            return " "
        return '""' if literals else t
    return _SKIP.sub(sub, text)


def _read(path: Path) -> Tuple[str, bytes]:
    with open(path, "rb") as f:
        return str(path), f.read()


def _scan(path: Path) -> Tuple[bool, bool, bool, bool]:
    """(nanobind module, pybind11 module, nanobind include, pybind11 include) in one source."""
    key = _read(path)
    memo = _memo.get(key)
    if memo is not None:
        return memo
    out = _scan_text(key[1].decode(errors="replace"))
    _memo[key] = out
    return out


def _facts(path: Path) -> "FileFacts":
    """ms_module.py's facts of one source (remembered per contents)."""
    from .ms_module import file_facts  # only for pybind11 sources
    key = _read(path)
    memo = _facts_memo.get(key)
    if memo is None:
        memo = _facts_memo[key] = file_facts(key[1].decode(errors="replace"), path.suffix)
    return memo


def why_pybind11(sources: Sequence[Path]) -> Optional[str]:
    """None when a pybind11 source set binds only plain functions that nanobind binds alike (so it is
    built with nanobind); else why it stays on pybind11."""
    from .ms_module import nanobind_safe
    ok, why = nanobind_safe([(s.name, _facts(s)) for s in sources])
    return None if ok else why


def _scan_text(raw: str) -> Tuple[bool, bool, bool, bool]:
    code = _strip(raw, literals=True)  # macros in code only
    text = _strip(raw, literals=False)  # include names ("ms_extension.h") kept
    return (_NB_MODULE.search(code) is not None, _PB_MODULE.search(code) is not None,
            _NB_INCLUDE.search(text) is not None, _PB_INCLUDE.search(text) is not None)


def binding_of_text(text: str) -> Optional[str]:
    """``PYBIND11`` or ``NANOBIND`` when C++ source ``text`` names one of them (its module macro or an
    include), None when it names neither (or both: the build of the file says so)."""
    nb_mod, pb_mod, nb_inc, pb_inc = _scan_text(text)
    nb, pb = nb_mod or nb_inc, pb_mod or pb_inc
    return None if nb == pb else (NANOBIND if nb else PYBIND11)


def from_pybind11(sources: Sequence[Path]) -> bool:
    """True when ``sources`` are written for pybind11 (PYBIND11_MODULE, ms_extension.h) and are built with
    nanobind all the same (why_pybind11 found nothing against it): the builder falls back to pybind11
    if that build fails."""
    scans = [_scan(s) for s in sources]
    return (not any(nb_mod or nb_inc for nb_mod, _, nb_inc, _ in scans)
            and any(pb_mod or pb_inc for _, pb_mod, _, pb_inc in scans) and why_pybind11(sources) is None)


def detect_binding(name: str, sources: Sequence[Path]) -> str:
    """``PYBIND11`` or ``NANOBIND`` for operator ``name``'s sources as they are now (remembered per
    contents); BuildError if they mix the two."""
    nb, pb = [], []
    for s in sources:
        nb_mod, pb_mod, nb_inc, pb_inc = _scan(s)
        if nb_mod or nb_inc:
            nb.append(s.name)
        if pb_mod or pb_inc:
            pb.append(s.name)
    if nb and pb:
        raise BuildError(f"operator '{name}' mixes binding libraries: {', '.join(nb)} use(s) nanobind "
                         f"(OB_MODULE, NB_MODULE or <nanobind/...>) and {', '.join(pb)} use(s) pybind11 "
                         f"(PYBIND11_MODULE, <pybind11/...> or ms_extension.h); one module is bound with one of "
                         f"them: write it with OB_MODULE(m) (nanobind) or PYBIND11_MODULE(OB_EXTENSION_NAME, m)",
                         name=name)
    if nb:
        return NANOBIND
    return NANOBIND if pb and why_pybind11(sources) is None else PYBIND11
