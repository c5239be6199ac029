"""A compiler launcher (``OPBUILDER_COMPILER_LAUNCHER``) that remembers each compile for the test run.

The shipping tests build opbuilder's native runtime several times from the same files: the wheel and
the editable install under 3.12 (tests/test_shipping.py), ``pip install``'s build and the wheel of
tests/ship_util.py under 3.11. Each build uses a fresh temporary cache, so each compiled everything
again. Through this launcher a compile whose command line (output paths aside), compiler and input
files are the same as an earlier one's gets that compile's object and dependency file, as ccache's
direct mode does; anything else runs the compiler. The builds, links and records are the real ones.

An entry is keyed by the compiler (its path, size and mtime), the arguments and the environment the
compiler reads; it lists every file the compile read (its ``-MF`` dependency file) with its content's
hash, checked on every use: an edited header is a miss. Entries live in ``<the session cache's parent>/compile-memo``
(shared by the xdist workers; ``launcher_env`` gives the variables) and are published by an atomic rename.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional

ENV = "OPBUILDER_TEST_COMPILE_MEMO"
# what the compiler reads from the environment (opbuilder/tools/toolchain.py COMPILER_ENV and the like)
_COMPILER_ENV = ("CPATH", "CPLUS_INCLUDE_PATH", "C_INCLUDE_PATH", "GCC_EXEC_PREFIX", "COMPILER_PATH",
                 "LIBRARY_PATH", "SOURCE_DATE_EPOCH", "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS")


def launcher_env(shared: Path) -> Dict[str, str]:
    """The variables that make opbuilder's builds compile through this launcher, remembered under
    ``shared`` (the test run's directory: the session cache's parent)."""
    return {"OPBUILDER_COMPILER_LAUNCHER": f"{sys.executable} {Path(__file__).resolve()}",
            ENV: str(Path(shared) / "compile-memo")}


def _digest(path: str) -> Optional[str]:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def _deps(depfile: str) -> List[str]:
    """The files a make-style dependency file lists (each rule's prerequisites)."""
    text = Path(depfile).read_text().replace("\\\n", " ")
    words: List[str] = []
    for line in text.splitlines():
        _, sep, rest = line.partition(": ")
        if sep:
            words += [w.replace("\0", " ") for w in rest.replace("\\ ", "\0").split()]
    return list(dict.fromkeys(words))


def _key(args: List[str], out: str, depfile: str) -> str:
    compiler = shutil.which(args[0]) or args[0]
    st = os.stat(compiler)
    parts = {"compiler": [os.path.realpath(compiler), st.st_size, st.st_mtime_ns],
             "args": ["<out>" if a == out else "<dep>" if a == depfile else a for a in args[1:]],
             "env": {k: os.environ[k] for k in _COMPILER_ENV if k in os.environ},
             # debug information names the directory compiled in
             "cwd": os.getcwd() if any(a.startswith("-g") for a in args) else ""}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def _reuse(entry: Path, out: str, depfile: str) -> bool:
    try:
        record = json.loads((entry / "deps.json").read_text())
    except (OSError, ValueError):
        return False
    if any(_digest(p) != h for p, h in record.items()):
        return False
    shutil.copyfile(entry / "object", out)
    shutil.copyfile(entry / "depfile", depfile)
    return True


def _remember(entry: Path, out: str, depfile: str) -> None:
    record = {p: _digest(p) for p in _deps(depfile)}
    if None in record.values():
        return
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=entry.parent, prefix=".tmp-"))
    shutil.copyfile(out, tmp / "object")
    shutil.copyfile(depfile, tmp / "depfile")
    (tmp / "deps.json").write_text(json.dumps(record))
    try:
        os.rename(tmp, entry)
    except OSError:  # another process remembered it first
        shutil.rmtree(tmp, ignore_errors=True)


def main(args: List[str]) -> int:
    memo = os.environ.get(ENV)
    if not memo or "-c" not in args or "-o" not in args or "-MF" not in args:
        return subprocess.call(args)
    out, depfile = args[args.index("-o") + 1], args[args.index("-MF") + 1]
    entry = Path(memo) / _key(args, out, depfile)
    if _reuse(entry, out, depfile):
        return 0
    rc = subprocess.call(args)
    if rc == 0:
        _remember(entry, out, depfile)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
