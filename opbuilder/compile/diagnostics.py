"""A failed build's diagnostics as records: ``Diagnostic(file, line, column, severity, message)``.

The build shows the compiler's own text (it says the most: the instantiation
chain, the source excerpt, the caret), so that is what ninja runs. gcc 12's
``-fdiagnostics-format=json`` prints a JSON array *instead* of that text, and
drops the "required from here" and "In file included from" lines. So after a
failed g++ compile, its command runs once more with ``-fsyntax-only
-fdiagnostics-format=json`` (the front end only, writing nothing) and the
records come from that JSON; a compiler that cannot (clang, nvcc, a failure
the second run does not repeat) has its text parsed instead: gcc's and clang's
``file:line:col: error: message`` and nvcc's own front end's
``file(line): error: message``; nvcc's assembler (ptxas) names no line, so its
errors are at the ``.cu`` file it compiled, with no line.

Each record points at the user's file. One whose location is in a file that is
not theirs (opbuilder's headers, pybind11's, the standard library's) is moved to
the user's line that led there: the "required from here" of the instantiation,
else the ``#include`` line. Relative paths are made absolute against the build
directory, where the compiler ran.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

__all__ = ["Diagnostic", "parse_text", "parse_json", "parse_ptxas", "from_build_log", "user_files", "failed_commands"]

SEVERITIES = ("error", "fatal error", "warning")


class Diagnostic(NamedTuple):
    """One compiler diagnostic at a place in the user's sources.

    ``file`` is an absolute path (for ``load_inline`` sources: the file holding the user's string, whose
    line N is line N of that string); ``line`` and ``column`` count from 1 (``column`` None when the
    compiler gives none, ``line`` None when the diagnostic is about generated code with no line of the
    user's, a ``functions=`` name that does not exist, or about a whole CUDA kernel, as nvcc's assembler's
    are); ``severity`` is ``"error"``, ``"fatal error"`` or ``"warning"``; ``message`` is the compiler's,
    without its location."""

    file: str
    line: Optional[int]
    column: Optional[int]
    severity: str
    message: str


IsUser = Callable[[str], bool]
_GCC_RE = re.compile(r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?:(?P<col>\d+):)?\s*"
                     r"(?P<sev>fatal error|error|warning):\s*(?P<msg>.*)$")
_NVCC_RE = re.compile(r"^(?P<file>[^\s(][^(]*)\((?P<line>\d+)\):\s*(?P<sev>catastrophic error|error|warning)"
                      r"(?: #[\w-]+(?:-D)?)?:\s*(?P<msg>.*)$")
_HERE_RE = re.compile(r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?:(?P<col>\d+):)?\s+required from here")
_INCLUDED_RE = re.compile(r"^(?:In file included from|\s+from) (?P<file>[^\s:][^:]*):(?P<line>\d+)")
_PTXAS_RE = re.compile(r"^ptxas (?P<sev>error|fatal|warning)\s*:\s*(?P<msg>.*)$")
_FAILED_RE = re.compile(r"^FAILED: (?:\[code=\d+\] )?(?P<outputs>.*)$")
_JSON_FLAGS = ("-fsyntax-only", "-fdiagnostics-format=json")


def user_files(sources: Sequence[object], not_users: Sequence[str]) -> IsUser:
    """A test for "this file is the user's": a source, a file beside one, or any file not under one
    of ``not_users`` (opbuilder's, pybind11's, Python's, the compiler's directories, the cache)."""
    src_dirs = tuple(os.path.realpath(os.path.dirname(str(s))) + "/" for s in sources)
    others = tuple(os.path.realpath(d).rstrip("/") + "/" for d in not_users)

    def is_user(path: str) -> bool:
        real = os.path.realpath(path)
        return real.startswith(src_dirs) or not real.startswith(others)
    return is_user


def _absolute(file: str, cwd: str) -> str:
    return os.path.normpath(os.path.join(cwd, file))


def _origin(lines: List[str], i: int, cwd: str, is_user: IsUser) -> Optional[Tuple[str, int, Optional[int]]]:
    """For the diagnostic at ``lines[i]`` in a file not the user's: the user's line that led to it
    (the instantiation's "required from here", else the ``#include``), from the lines gcc prints
    before it; None if there is none."""
    included = None
    for j in range(i - 1, -1, -1):
        line = lines[j]
        if _GCC_RE.match(line):
            break
        m = _HERE_RE.match(line)
        if m and is_user(_absolute(m.group("file"), cwd)):
            return _absolute(m.group("file"), cwd), int(m.group("line")), int(m.group("col") or 0) or None
        m = _INCLUDED_RE.match(line)
        if m and included is None and is_user(_absolute(m.group("file"), cwd)):
            included = (_absolute(m.group("file"), cwd), int(m.group("line")), None)
    return included


def _placed(d: Diagnostic, lines: List[str], cwd: str, is_user: IsUser) -> Diagnostic:
    """``d`` at the user's line: as it is when its file is the user's, else where the text says the
    user's code led to it (kept where it is when the text does not say)."""
    if is_user(d.file):
        return d
    for i, line in enumerate(lines):
        m = _GCC_RE.match(line)
        if (m and _absolute(m.group("file"), cwd) == d.file and int(m.group("line")) == d.line
                and m.group("msg").strip() == d.message):
            where = _origin(lines, i, cwd, is_user)
            if where is not None:
                return d._replace(file=where[0], line=where[1], column=where[2])
            break
    return d


def _nvcc_column(lines: List[str], i: int, file: str, line: int) -> Optional[int]:
    """nvcc's front end gives no column: it echoes the line, indented by two spaces, and a caret under
    it. The caret's column, when the echo is that line of ``file`` as it is now; else None."""
    if i + 2 >= len(lines) or not lines[i + 1].startswith("  ") or lines[i + 2].strip() != "^":
        return None
    try:
        with open(file, errors="replace") as f:
            text = f.read().splitlines()
    except OSError:
        return None
    if not 0 < line <= len(text) or text[line - 1].rstrip() != lines[i + 1][2:].rstrip() or "\t" in text[line - 1]:
        return None
    return lines[i + 2].index("^") - 1


def parse_text(text: str, cwd: str, is_user: IsUser = lambda p: True) -> List[Diagnostic]:
    """The errors and warnings in compiler ``text``: gcc's and clang's ``file:line:col: error: msg``
    and nvcc's ``file(line): error: msg``, each once, at the user's line."""
    lines = text.splitlines()
    out: List[Diagnostic] = []
    for i, line in enumerate(lines):
        m = _GCC_RE.match(line) or _NVCC_RE.match(line)
        if m is None:
            continue
        col = m.groupdict().get("col")
        sev = m.group("sev").replace("catastrophic error", "fatal error")
        d = Diagnostic(_absolute(m.group("file"), cwd), int(m.group("line")), int(col) if col else None, sev,
                       m.group("msg").strip())
        if col is None and "col" not in m.groupdict():
            d = d._replace(column=_nvcc_column(lines, i, d.file, d.line))
        if not is_user(d.file):
            where = _origin(lines, i, cwd, is_user)
            if where is not None:
                d = d._replace(file=where[0], line=where[1], column=where[2])
        if d not in out:
            out.append(d)
    return out


def parse_json(data: str, cwd: str) -> Optional[List[Diagnostic]]:
    """The errors and warnings in gcc's ``-fdiagnostics-format=json`` output (one array per
    translation unit, with no separator between arrays); None if ``data`` is not that."""
    decoder = json.JSONDecoder()
    out: List[Diagnostic] = []
    texts: Dict[str, Optional[List[bytes]]] = {}
    pos, data = 0, data.strip()
    if not data.startswith("["):
        return None
    while pos < len(data):
        try:
            items, pos = decoder.raw_decode(data, pos)
        except ValueError:
            return None
        while pos < len(data) and data[pos].isspace():
            pos += 1
        if not isinstance(items, list):
            return None
        for item in items:
            if not isinstance(item, dict) or item.get("kind") not in SEVERITIES:
                continue
            locations = item.get("locations") or [{}]
            caret = locations[0].get("caret") or {}
            if "file" not in caret:
                continue
            file = _absolute(caret["file"], cwd)
            out.append(Diagnostic(file, caret.get("line"), _char_column(caret, file, texts), item["kind"],
                                  str(item.get("message", "")).strip()))
    return out


def _char_column(caret: Dict[str, object], file: str, texts: Dict[str, Optional[List[bytes]]]) -> Optional[int]:
    """The caret's column in characters of its line, counted from 1. gcc's ``column`` is a display
    column (a tab reaches the next multiple of 8, a CJK character is 2 wide); its ``byte-column`` is
    converted with the line as the file holds it; the display column when the file cannot be read."""
    column, byte_column, line = caret.get("column"), caret.get("byte-column"), caret.get("line")
    if not isinstance(byte_column, int) or not isinstance(line, int) or byte_column < 1 or line < 1:
        return column if isinstance(column, int) else None
    if file not in texts:
        try:
            with open(file, "rb") as f:
                texts[file] = f.read().splitlines()
        except OSError:
            texts[file] = None
    lines = texts[file]
    if lines is None or line > len(lines) or byte_column > len(lines[line - 1]) + 1:
        return column if isinstance(column, int) else None
    return len(lines[line - 1][:byte_column - 1].decode("utf-8", errors="replace")) + 1


def failed_commands(log: str) -> List[Tuple[str, str]]:
    """(command line, its output) of each step ninja reports as FAILED in ``log``."""
    lines = log.splitlines()
    out = []
    for i, line in enumerate(lines[:-1]):
        if _FAILED_RE.match(line):
            end = i + 2
            while end < len(lines) and not (_FAILED_RE.match(lines[end]) or lines[end].startswith("ninja: ")):
                end += 1
            out.append((lines[i + 1], "\n".join(lines[i + 2:end])))
    return out


def _is_nvcc(command: str) -> bool:
    try:
        words = shlex.split(command)
    except ValueError:
        return True  # not a command we can run again: parse its text
    return any(os.path.basename(w).startswith("nvcc") for w in words[:2])


def _json_rerun(command: str, cwd: str, env: Dict[str, str], timeout: float) -> Optional[List[Diagnostic]]:
    """The diagnostics of failed compile ``command`` run again for gcc's JSON; None if it gives none."""
    if " -c " not in command or _is_nvcc(command) or timeout <= 0 or any(c in command for c in "&|;<>`$"):
        return None  # a link, nvcc (no JSON), no time left, or a shell's command line: its text is parsed
    import signal

    # without its depfile (-MD -MF f), with nothing written (-fsyntax-only: a second -o is refused); in a
    # session of its own: on a timeout the driver and cc1plus are killed together
    argv: List[str] = []
    words = iter(shlex.split(command))
    for w in words:
        if w in ("-MF", "-MT", "-MQ"):
            next(words, None)
        elif w not in ("-MD", "-MMD"):
            argv.append(w)
    argv += _JSON_FLAGS
    try:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, text=True, errors="replace", start_new_session=True)
    except OSError:
        return None
    try:
        _, err = proc.communicate(timeout=timeout)
    except BaseException as e:  # out of time (then no records from it), or interrupted
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.communicate()
        if isinstance(e, subprocess.TimeoutExpired):
            return None
        raise
    return parse_json(err, cwd) or None


def _compiled_source(command: str, cwd: str) -> Optional[str]:
    """The source file compile ``command`` compiles (the word after ``-c``), absolute; None if none."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    for flag, word in zip(words, words[1:]):
        if flag == "-c":
            return _absolute(word, cwd)
    return None


def parse_ptxas(text: str, source: str) -> List[Diagnostic]:
    """nvcc's assembler (ptxas) errors and warnings: they name no file or line (they are about a whole
    kernel: too much shared memory, too many registers, an unresolved function), so each is at
    ``source``, the ``.cu`` file nvcc was compiling, with no line."""
    out: List[Diagnostic] = []
    for line in text.splitlines():
        m = _PTXAS_RE.match(line.strip())
        if m:
            sev = {"fatal": "fatal error"}.get(m.group("sev"), m.group("sev"))
            d = Diagnostic(source, None, None, sev, m.group("msg").strip())
            if d not in out:
                out.append(d)
    return out


def from_build_log(log: str, cwd: str, is_user: IsUser, env: Optional[Dict[str, str]] = None,
                   timeout: float = 60.0) -> List[Diagnostic]:
    """The diagnostics of a failed build whose ninja output is ``log``: from gcc's JSON where a failed
    compile can run again for it, else from its text; each at the user's line."""
    blocks = failed_commands(log) or [("", log)]
    out: List[Diagnostic] = []
    for command, text in blocks:
        found = _json_rerun(command, cwd, dict(os.environ) if env is None else env, timeout) if command else None
        if found is None:
            found = parse_text(text, cwd, is_user)
        if not found and command and _is_nvcc(command):  # past nvcc's front end: its assembler's words
            source = _compiled_source(command, cwd)
            found = parse_ptxas(text, source) if source else []
        lines = text.splitlines()
        for d in found:
            d = _placed(d, lines, cwd, is_user)
            if d not in out:
                out.append(d)
    return out
