"""Which binding library a module's sources use: pybind11 or nanobind, read from the sources.

A source set is nanobind when a source defines its module with ``OB_MODULE(m)`` or ``NB_MODULE(...)``
(or includes ``<nanobind/...>``), and pybind11 when one uses ``PYBIND11_MODULE(...)`` (or includes
``<pybind11/...>`` or ``ms_extension.h``). Comments and string literals are skipped, so a comment
that mentions a macro decides nothing, and so do the regions the preprocessor certainly skips
(``#if 0`` blocks, the ``#else`` of an ``#if 1``), read after backslash-newlines are joined, as the
compiler reads them. Sources that mention both are an error: the builder never
guesses which of the two a module needs. Sources that mention neither (a module written on the
plain Python C API, or one whose module macro is in a header) build as they always did, on the
pybind11 path; a nanobind module in a header would fail to compile there (nanobind's headers
are not on that path), never load wrongly.

The scan (~0.25 ms for a 5 KB source) is remembered by the source's content digest: in the process,
and in the operator's cache directory (``.bindings.json``, the current sources' digests only), so a
warm load() in a new process hashes its sources and reads that record instead of scanning them. An
edited source has another digest, so it is scanned again: the record never stands for other bytes.

One pybind11 case is built with nanobind: code written for ``ms_extension.h`` whose module only binds
plain functions (``m.def("mul", &fn, "doc")``) of argument types both layers convert alike, as
ms_module.py decides (strictly: anything else stays on pybind11). ``why_pybind11`` says why a source
set was not. That decision is recorded too, under the source set's digests.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Set, Tuple

from ..errors import BuildError
from ..cache.fingerprint import bytes_digest
from ..cache.trust import check_dir, read_file, write_file

if TYPE_CHECKING:
    from .ms_module import FileFacts

__all__ = ["PYBIND11", "NANOBIND", "RECORD", "binding_of_text", "detect_binding", "binding_and_digests",
           "from_pybind11", "why_pybind11"]

PYBIND11 = "pybind11"
NANOBIND = "nanobind"
RECORD = ".bindings.json"  # in an operator's cache directory: {content digest: "01002", "set:...": "nanobind"}
SCAN = "2"  # the scan's version, the last character of each entry (2: what the preprocessor skips is skipped)

# comments and literals (kept apart so that a quote inside a comment or a // inside a string is skipped whole)
_SKIP = re.compile(r'//[^\n]*|/\*.*?\*/|R"([^(\s]{0,16})\(.*?\)\1"|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'',
                   re.S)
_NB_MODULE = re.compile(r"\b(?:OB_MODULE|NB_MODULE)\s*\(")
_PB_MODULE = re.compile(r"\bPYBIND11_MODULE\s*\(")
_NB_INCLUDE = re.compile(r'#\s*include\s*<nanobind/')
_PB_INCLUDE = re.compile(r'#\s*include\s*(?:<pybind11/|"ms_extension\.h"|<ms_extension\.h>)')
_SPLICE = re.compile(r"\\[ \t]*\r?\n")  # a backslash ending a line (gcc allows blanks after it)
_CONDITIONAL = re.compile(r"^\s*#\s*(if|ifdef|ifndef|elif|elifdef|elifndef|else|endif)\b(.*)$")
_NUMBER = re.compile(r"(0[xX][0-9a-fA-F]+|[0-9]+)[uUlL]*")
Flags = Tuple[bool, bool, bool, bool]  # nanobind module, pybind11 module, nanobind include, pybind11 include
_memo: Dict[str, Flags] = {}  # content digest -> flags, in this process
_unrecorded: Set[str] = set()  # digests (and set keys) worked out here but not yet written to a record
_sets: Dict[str, str] = {}  # set key of a pybind11 source set -> the binding it is built with
_facts_memo: Dict[Tuple[str, bytes], "FileFacts"] = {}


def _strip(text: str, literals: bool) -> str:
    """``text`` without comments; with string and character literals emptied too if ``literals``."""
    def sub(m: "re.Match[str]") -> str:
        t = m.group(0)
        if t.startswith("/"):
            return " "
        return '""' if literals else t
    return _SKIP.sub(sub, text)


def _truth(expr: str) -> Optional[bool]:
    """The value of an ``#if``/``#elif`` condition when it is a constant (``0``, ``1``, ``0x0``, ``true``,
    ``!0``, ``(0)``); None for anything else (a macro, ``defined(...)``, an expression): not known here."""
    e = expr.strip()
    negate = False
    while True:
        if e.startswith("(") and e.endswith(")") and "(" not in e[1:-1] and ")" not in e[1:-1]:
            e = e[1:-1].strip()
        elif e.startswith("!") and not e.startswith("!="):
            negate, e = not negate, e[1:].strip()
        else:
            break
    if e in ("true", "false"):
        value = e == "true"
    else:
        m = _NUMBER.fullmatch(e)
        if m is None:
            return None
        value = any(c not in "0xX" for c in m.group(1))
    return value != negate


def _live(code: str) -> str:
    """``code`` (comments stripped, lines spliced) without the regions the preprocessor skips for
    certain: ``#if 0`` blocks, the ``#else``/``#elif`` branches after a branch that is certainly taken
    (``#if 1``), and everything nested in those. A condition that is not a constant (``#ifdef X``) may go
    either way, so each of its branches counts. Conditional directives themselves are dropped."""
    out: List[str] = []
    # per open #if: [enclosing region live, this branch: True / False / None (not known),
    #                an earlier branch certainly taken, an earlier branch maybe taken]
    stack: List[List[Optional[bool]]] = []
    live = True
    for line in code.split("\n"):
        m = _CONDITIONAL.match(line)
        if m is None:
            if live:
                out.append(line)
            continue
        word, rest = m.group(1), m.group(2)
        if word in ("if", "ifdef", "ifndef"):
            t = _truth(rest) if word == "if" else None
            stack.append([live, t, t is True, t is None])
        elif not stack:
            continue  # an unbalanced #else/#endif: the compiler says so
        elif word == "endif":
            stack.pop()
        else:
            frame = stack[-1]
            t = True if word == "else" else (_truth(rest) if word == "elif" else None)
            if frame[2]:
                frame[1] = False
            else:
                frame[1] = None if (frame[3] and t is not False) else t
                frame[2] = t is True and not frame[3]
                frame[3] = frame[3] or t is None
        live = all(f[0] and f[1] is not False for f in stack[-1:]) if stack else True
    return "\n".join(out)


def _scan_text(raw: str) -> Tuple[bool, bool, bool, bool]:
    # as the compiler reads it: lines joined at a backslash-newline first (a `// comment \` goes on
    # to the next line), then comments and literals, then the regions the preprocessor skips
    spliced = _SPLICE.sub("", raw)
    code = _live(_strip(spliced, literals=True))  # macros in code only
    text = _live(_strip(spliced, literals=False))  # include names ("ms_extension.h") kept
    return (_NB_MODULE.search(code) is not None, _PB_MODULE.search(code) is not None,
            _NB_INCLUDE.search(text) is not None, _PB_INCLUDE.search(text) is not None)


def binding_of_text(text: str) -> Optional[str]:
    """``PYBIND11`` or ``NANOBIND`` when C++ source ``text`` names one of them (its module macro or an
    include), None when it names neither (or both: the build of the file says so)."""
    nb_mod, pb_mod, nb_inc, pb_inc = _scan_text(text)
    nb, pb = nb_mod or nb_inc, pb_mod or pb_inc
    return None if nb == pb else (NANOBIND if nb else PYBIND11)


def _decode(value: object) -> Optional[Flags]:
    """The flags of a record entry; None for one this scan did not write (another format, or an older
    scan's, which read ``#if 0`` blocks as code): then the source is scanned again."""
    if not (isinstance(value, str) and len(value) == 5 and value.endswith(SCAN) and set(value[:4]) <= {"0", "1"}):
        return None
    return value[0] == "1", value[1] == "1", value[2] == "1", value[3] == "1"


def _read_record(record: Path) -> Dict[str, object]:
    """The record's entries; {} when there is none or it is not one opbuilder wrote (then the sources
    are scanned and it is written again). A record (or its directory) that is not ours or is a link
    raises (trust.py), as everything in the cache does."""
    try:
        check_dir(record.parent)
        data = json.loads(read_file(record))
    except (FileNotFoundError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_record(record: Path, entries: Dict[str, str]) -> None:
    """Best effort: the record of ``entries`` (the current sources, encoded), when the operator's
    directory exists; one that cannot be written is worked out again next time."""
    try:
        check_dir(record.parent)
        write_file(record, json.dumps(entries).encode())
    except OSError:
        return
    _unrecorded.difference_update(entries)


def _encode(flags: Flags) -> str:
    return "".join("1" if f else "0" for f in flags) + SCAN


def _flags(sources: Sequence[Path], record: Optional[Path]
           ) -> Tuple[List[Flags], List[str], Optional[Dict[str, object]]]:
    """Each source's flags, by its contents now: remembered in this process, else read from
    ``record``, else scanned; its digest; and the record's entries if it was read."""
    out: List[Flags] = []
    digests: List[str] = []
    stored: Optional[Dict[str, object]] = None
    for s in sources:
        with open(s, "rb") as f:
            data = f.read()
        digest = bytes_digest(data)
        flags = _memo.get(digest)
        if flags is None:
            if stored is None:
                stored = _read_record(record) if record is not None else {}
            flags = _decode(stored.get(digest))
            if flags is None:
                flags = _scan_text(data.decode(errors="replace"))
                _unrecorded.add(digest)
            _memo[digest] = flags
        out.append(flags)
        digests.append(digest)
    return out, digests, stored


def _read(path: Path) -> Tuple[str, bytes]:
    with open(path, "rb") as f:
        return str(path), f.read()


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


def _set_key(sources: Sequence[Path], digests: Sequence[str]) -> str:
    return "set:" + "+".join(f"{s.suffix}:{d}" for s, d in zip(sources, digests))


def _pybind11_set(sources: Sequence[Path], digests: Sequence[str], stored: Optional[Dict[str, object]],
                  record: Optional[Path]) -> str:
    """The binding a pybind11 source set is built with (why_pybind11): remembered in this process,
    else read from ``record``, else worked out."""
    key = _set_key(sources, digests)
    binding = _sets.get(key)
    if binding is None:
        if stored is None:
            stored = _read_record(record) if record is not None else {}
        value = stored.get(key)
        if value in (NANOBIND, PYBIND11):
            binding = str(value)
        else:
            binding = NANOBIND if why_pybind11(sources) is None else PYBIND11
            _unrecorded.add(key)
        _sets[key] = binding
    return binding


def from_pybind11(sources: Sequence[Path]) -> bool:
    """True when ``sources`` are written for pybind11 (PYBIND11_MODULE, ms_extension.h) and are built with
    nanobind all the same (why_pybind11 found nothing against it): the builder falls back to pybind11
    if that build fails."""
    flags, digests, _ = _flags(sources, None)
    return (not any(nb_mod or nb_inc for nb_mod, _, nb_inc, _ in flags)
            and any(pb_mod or pb_inc for _, pb_mod, _, pb_inc in flags)
            and _pybind11_set(sources, digests, {}, None) == NANOBIND)


def detect_binding(name: str, sources: Sequence[Path], record: Optional[Path] = None) -> str:
    """``PYBIND11`` or ``NANOBIND`` for operator ``name``'s sources as they are now; BuildError if
    they mix the two. ``record``: the operator's ``RECORD`` in a checked cache directory, which
    remembers the answer per content digest across processes (read, and written after a scan)."""
    return binding_and_digests(name, sources, record)[0]


def binding_and_digests(name: str, sources: Sequence[Path], record: Optional[Path] = None
                        ) -> Tuple[str, Dict[str, str]]:
    """``detect_binding`` and the digest of each source it read (fingerprint.source_digests of the same
    bytes), so that a warm load() reads and hashes each source once."""
    flags, digests, stored = _flags(sources, record)
    nb, pb = [], []
    for s, (nb_mod, pb_mod, nb_inc, pb_inc) in zip(sources, flags):
        if nb_mod or nb_inc:
            nb.append(s.name)
        if pb_mod or pb_inc:
            pb.append(s.name)
    if nb and pb:
        raise BuildError(f"operator '{name}' mixes binding libraries: {', '.join(nb)} use(s) nanobind "
                         f"(OB_MODULE, NB_MODULE or <nanobind/...>) and {', '.join(pb)} use(s) pybind11 "
                         f"(PYBIND11_MODULE, <pybind11/...> or ms_extension.h); one module is bound with one of "
                         f"them: write it with OB_MODULE(m) (nanobind) or PYBIND11_MODULE(OB_EXTENSION_NAME, m); sources "
                         f"that choose between the two with a macro (#ifdef) say which with binding='nanobind' or "
                         f"binding='pybind11'",
                         name=name)
    binding = NANOBIND if nb else PYBIND11
    if pb:
        binding = _pybind11_set(sources, digests, stored, record)
    if record is not None and _unrecorded:  # something worked out here: written once (never on a warm load)
        entries = {d: _encode(f) for d, f in zip(digests, flags)}
        if pb:
            entries[_set_key(sources, digests)] = binding
        if _unrecorded.intersection(entries):
            _write_record(record, entries)
    return binding, {str(s): d for s, d in zip(sources, digests)}
