"""Running ninja: a one-line progress status, the full log kept, errors made readable."""
from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

from .errors import BuildError

__all__ = ["run_ninja", "first_errors"]

log = logging.getLogger("opbuilder")
_STATUS = "@@opbuilder "
_STATUS_RE = re.compile(re.escape(_STATUS) + r"\[(\d+)/(\d+)\] (.*)")
_ERROR_RE = re.compile(r"^(?P<loc>[^\s:][^:]*:\d+(?::\d+)?):\s*(?:fatal )?error[:\s]")
_LINK_RE = re.compile(r"undefined reference to|multiple definition of|cannot find -l|ld returned|ld: error")


class _Status:
    """Writes 'opbuilder: building NAME [n/N] what' on one line of stderr."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.tty = sys.stderr.isatty()
        self.shown = False

    def show(self, text: str) -> None:
        line = f"opbuilder: building {self.name} {text}"
        if self.tty:
            sys.stderr.write("\r\033[K" + line)
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()
        self.shown = True

    def done(self, text: str) -> None:
        if self.tty and self.shown:
            sys.stderr.write("\r\033[K")
        sys.stderr.write(f"opbuilder: {text}\n")
        sys.stderr.flush()


def first_errors(output: str, limit: int = 6) -> List[str]:
    """The compiler's first error lines (file:line: error ...) and link errors, with context."""
    lines = output.splitlines()
    picked: List[str] = []
    for i, line in enumerate(lines):
        if _ERROR_RE.match(line) or _LINK_RE.search(line):
            picked.append(line)
            # gcc follows an error with the offending source line and a caret
            for extra in lines[i + 1:i + 3]:
                if extra.startswith(" ") and not _ERROR_RE.match(extra):
                    picked.append(extra)
            if sum(1 for p in picked if not p.startswith(" ")) >= limit:
                break
    return picked


def run_ninja(ninja: str, build_dir: Path, jobs: int, name: str, verbose: bool) -> float:
    """Run ninja in ``build_dir``; raise BuildError naming ``name`` on failure."""
    env = dict(os.environ)
    env["NINJA_STATUS"] = _STATUS + "[%f/%t] "
    argv = [ninja, "-j", str(jobs)] + (["-v"] if verbose else [])
    status = _Status(name)
    t0 = time.perf_counter()
    log.info("building %s in %s (%d jobs)", name, build_dir, jobs)
    proc = subprocess.Popen(argv, cwd=build_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, errors="replace")
    out: List[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        m = _STATUS_RE.match(line)
        if m:
            what = m.group(3).strip()
            if verbose:
                sys.stderr.write(what + "\n")
            status.show(f"[{m.group(1)}/{m.group(2)}] {what if not verbose else ''}".rstrip())
            out.append(what + "\n")
        else:
            out.append(line)
    rc = proc.wait()
    elapsed = time.perf_counter() - t0
    text = "".join(out)
    log_path = build_dir / "build.log"
    log_path.write_text(text)
    if rc != 0:
        status.done(f"building {name} failed")
        errs = first_errors(text) or [ln for ln in text.splitlines() if ln.strip()][-8:]
        msg = (f"building operator '{name}' failed:\n" + "\n".join(errs) +
               f"\nfull log: {log_path}")
        raise BuildError(msg, name=name, log=text, log_path=str(log_path))
    status.done(f"built {name} in {elapsed:.1f}s")
    return elapsed
