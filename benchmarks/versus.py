"""The same benchmark script on two commits, interleaved: did a change make calls slower?

    python benchmarks/versus.py BASE interop.py binding_call.py train.py [--rounds 3] [--goal 1.05]
                                [--args "--rounds 5"]

BASE is a commit (e.g. the parent of a change). A worktree of it is made under the system's temp
folder (kept for the next run). Each round runs every script once in each checkout, the order of the
two alternating (A B, B A, ...), so machine load falls on both alike. Every time cell of the scripts'
markdown tables (``12.30 us (11.90-13.05)``) is a row here, and so is every figure line outside them
(train.py's ``title: runtime 12.3 us (...)``, load_and_call.py's and builder.py's
``label  0.83 s (...)``): this checkout's median over BASE's, per round, printed as the median of the
rounds' ratios with their min-max, and MET when that median is within ``--goal`` (default 1.05: issue
33's "no per-call cost regression" bound). A row only one side
printed is shown but not judged. Each side builds its own operators into its own cache (one warm-up
run of each first, untimed).
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Tuple

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
_CELL = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ns|us|ms|s)\s*\(")
# the figure lines other scripts print: "title: runtime 12.3 us (..." (train.py) and
# "label   0.83 s (0.83-0.83) ..." (load_and_call.py, builder.py): the first figure, keyed by the label
_LINE = (re.compile(r"^(.+?):\s+runtime\s+([0-9]+(?:\.[0-9]+)?)\s*(ns|us|ms|s)\s*\("),
         re.compile(r"^([A-Za-z][^|]*?)\s{2,}([0-9]+(?:\.[0-9]+)?)\s*(ns|us|ms|s)\s*\("))
_SCALE = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def worktree(base: str) -> Path:
    """A checkout of ``base`` (made once, reused), for running its benchmark scripts."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", base], capture_output=True, text=True,
                         check=True).stdout.strip()
    path = Path(tempfile.gettempdir()) / f"opbuilder-versus-{sha[:12]}"
    if not (path / ".git").exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), sha], check=True,
                       capture_output=True)
    return path


def cells(text: str) -> Dict[Tuple[str, str], float]:
    """Seconds of every time cell of the markdown tables in ``text``, keyed by (row label, column), and
    of every figure line outside them, keyed by (label, "figure")."""
    out: Dict[Tuple[str, str], float] = {}
    head: List[str] = []
    for line in text.splitlines():
        if not line.startswith("|"):
            head = []
            for pat in _LINE:
                m = pat.match(line.strip())
                if m:
                    out[(m.group(1).strip(), "figure")] = float(m.group(2)) * _SCALE[m.group(3)]
                    break
            continue
        parts = [p.strip() for p in line.strip().strip("|").split("|")]
        if not head:
            head = parts
            continue
        if set(line.replace("|", "").strip()) <= {"-", ":"}:
            continue
        for col, cell in zip(head[1:], parts[1:]):
            m = _CELL.match(cell)
            if m:
                out[(parts[0], col)] = float(m.group(1)) * _SCALE[m.group(2)]
    return out


def run(checkout: Path, script: str, args: List[str], cache: Path) -> Dict[Tuple[str, str], float]:
    """One run of ``benchmarks/<script>`` in ``checkout``, with its own cache; its time cells."""
    env = dict(os.environ, OPBUILDER_CACHE_DIR=str(cache), PYTHONPATH=str(checkout))
    res = subprocess.run([sys.executable, str(checkout / "benchmarks" / script), *args], cwd=checkout,
                         capture_output=True, text=True, env=env, timeout=3600)
    if res.returncode != 0:
        print(f"  {checkout.name}: {script} exited {res.returncode}: "
              f"{(res.stderr or res.stdout).strip().splitlines()[-1:]}")
    return cells(res.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("base")
    ap.add_argument("scripts", nargs="+")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--goal", type=float, default=1.05)
    ap.add_argument("--args", default="", help="arguments for every script, e.g. '--rounds 5'")
    opts = ap.parse_args()
    base = worktree(opts.base)
    sides = {"base": base, "head": ROOT}
    caches = {k: Path(tempfile.gettempdir()) / f"opbuilder-versus-cache-{k}-{os.getuid()}" for k in sides}
    extra = shlex.split(opts.args)
    print(f"versus: {opts.base} (base, {base}) against this checkout; {opts.rounds} round(s), "
          f"load average {', '.join(f'{v:.1f}' for v in os.getloadavg())}")
    missed = 0
    for script in opts.scripts:
        for k in sides:  # warm-up: builds, caches
            run(sides[k], script, extra, caches[k])
        ratios: Dict[Tuple[str, str], List[float]] = {}
        for r in range(opts.rounds):
            order = ["base", "head"] if r % 2 == 0 else ["head", "base"]
            got = {k: run(sides[k], script, extra, caches[k]) for k in order}
            for key in set(got["base"]) | set(got["head"]):
                a, b = got["head"].get(key), got["base"].get(key)
                if a is not None and b is not None and b > 0:
                    ratios.setdefault(key, []).append(a / b)
                else:
                    ratios.setdefault(key, [])
        print(f"\n{script}\n| row | column | head / base | |\n|---|---|---|---|")
        for (row, col), rs in sorted(ratios.items()):
            if not rs:
                print(f"| {row} | {col} | one side only | |")
                continue
            med = statistics.median(rs)
            verdict = "MET" if med <= opts.goal else "MISSED"
            missed += verdict == "MISSED"
            print(f"| {row} | {col} | {med:.3f}x ({min(rs):.3f}-{max(rs):.3f}) | {verdict} |")
    print(f"\n{missed} row(s) over {opts.goal}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
