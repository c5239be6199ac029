"""Every ```python and ```cpp block in README.md and docs/ runs as written (issue 34).

A block is a whole program unless its first line is ``# (continues the block above)`` (``//`` in
C++): then it runs after the page's previous block of its language, with that block's names. A
first line ``# needs torch``, ``# needs jax``, ``# needs nvcc`` or ``# needs a CUDA GPU`` names what the block (and
the blocks continuing it) needs; without it here, the block is skipped and the skip says so.

Python: the blocks of one page run in one child process, in a scratch directory that sees the
repository's example sources (custom_src/, examples/, tests/). C++: each block is built by the real
builder (a module when it binds one, else a plain library for ops.Custom), with -Wall -Wextra -Werror.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional

import pytest

from builder_util import child_env

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# a fence may be indented (inside a list item): the block's lines carry the same indent
FENCE = re.compile(r"^([ \t]*)```(python|cpp)[ \t]*\n(.*?)^\1```[ \t]*$", re.S | re.M)
CONTINUES = "(continues the block above)"
NEEDS = re.compile(r"^(?:#|//) needs (torch|jax|nvcc|a CUDA GPU)\b")
# what a Python block calls that compiles: such a page is a build test (tests/build_guard.py checks it)
COMPILES = re.compile(r"CustomOpBuilder|load_inline|load_many|opbuilder\.load\(|ops\.Custom\(|build_library|@jit|jit\(")


class Block(NamedTuple):
    page: str  # relative to the repository
    line: int  # of the opening fence
    lang: str
    code: str
    needs: Optional[str]


def _blocks(page: Path) -> List[List[Block]]:
    """The page's blocks, grouped into chains: a block and the blocks that continue it."""
    text = page.read_text()
    rel = str(page.relative_to(ROOT))
    chains: List[List[Block]] = []
    last: Dict[str, List[Block]] = {}
    for m in FENCE.finditer(text):
        lang, code = m.group(2), textwrap.dedent(m.group(3))
        first = code.split("\n", 1)[0].strip()
        line = text.count("\n", 0, m.start()) + 1
        need = NEEDS.match(first)
        if first.lstrip("#/ ").strip() == CONTINUES:
            assert lang in last, f"{rel}:{line}: a block continues the one above, but none comes before it"
            chain = last[lang]
            chain.append(Block(rel, line, lang, code, chain[0].needs))
            continue
        chain = [Block(rel, line, lang, code, need.group(1) if need else None)]
        chains.append(chain)
        last[lang] = chain
    return chains


def _missing(need: Optional[str]) -> Optional[str]:
    """Why a block that needs ``need`` cannot run here (None: it can)."""
    if need in ("torch", "jax"):
        return None if importlib.util.find_spec(need) else f"needs {need}, which is not installed"
    if need == "nvcc":  # the CUDA compiler alone: a CUDA build with cuda_arch= needs no GPU
        from opbuilder.tools.toolchain import which
        return None if which("nvcc") else "needs nvcc, which is not on PATH"
    if need == "a CUDA GPU":
        import runtime.cuda
        return None if runtime.cuda.is_available() else f"needs a CUDA GPU ({runtime.cuda.unavailable_reason()})"
    return None


def _marks(compiles: bool, need: Optional[str]) -> list:
    """``build`` for what compiles; ``gpu`` for what needs a GPU (``pytest -m gpu`` runs it)."""
    return ([pytest.mark.build] if compiles else []) + ([pytest.mark.gpu] if need == "a CUDA GPU" else [])


def _params(lang: str):
    out = []
    for page in PAGES:
        for chain in _blocks(page):
            if chain[0].lang != lang:
                continue
            head = chain[0]
            compiles = lang == "cpp" or any(COMPILES.search(b.code) for b in chain)
            out.append(pytest.param(chain, id=f"{head.page}:{head.line}", marks=_marks(compiles, head.needs)))
    return out


def _by_page(params) -> list:
    """One parameter per page and requirement: the chains of that page that need the same thing."""
    groups: Dict[tuple, list] = {}
    compiles: Dict[tuple, bool] = {}
    for p in params:
        chain = p.values[0]
        key = (chain[0].page, chain[0].needs or "")
        groups.setdefault(key, []).append(chain)
        compiles[key] = compiles.get(key, False) or any(m.name == "build" for m in p.marks)
    return [pytest.param(chains, id=page + (f"[needs {need}]" if need else ""),
                         marks=_marks(compiles[(page, need)], need or None))
            for (page, need), chains in groups.items()]


DRIVER = r"""
import runpy, sys, traceback
for path, where in zip(sys.argv[1::2], sys.argv[2::2]):
    try:
        runpy.run_path(path, run_name="__main__")
    except BaseException:
        traceback.print_exc()
        print(f"the block at {where} failed", file=sys.stderr)
        sys.exit(1)
print("all blocks ran")
"""


def _script(chain: List[Block], work: Path) -> Path:
    """The chain as one file whose line numbers are the page's (a hybrid kernel's source must be in a
    file; a traceback's line is then the page's line)."""
    lines: List[str] = []
    for b in chain:
        lines += [""] * (b.line - len(lines))
        lines += b.code.rstrip("\n").split("\n")
    path = work / (re.sub(r"\W", "_", chain[0].page) + f"_{chain[0].line}.py")
    path.write_text("\n".join(lines) + "\n")
    return path


def _scratch(tmp_path: Path) -> Path:
    """A working directory where the blocks' relative paths (custom_src/..., examples/...) resolve."""
    work = tmp_path / "work"
    work.mkdir()
    for name in ("custom_src", "examples", "tests"):
        os.symlink(ROOT / name, work / name)
    return work


@pytest.mark.parametrize("chains", _by_page(_params("python")))
def test_python_blocks_run_as_written(chains, tmp_path, cache_dir):
    why = _missing(chains[0][0].needs)
    if why:
        pytest.skip(f"{chains[0][0].page}: {why}")
    work = _scratch(tmp_path)
    args = [a for chain in chains for a in (str(_script(chain, work)), f"{chain[0].page}:{chain[0].line}")]
    res = subprocess.run([sys.executable, "-c", DRIVER, *args], cwd=work,
                         env=child_env(OPBUILDER_CACHE_DIR=str(cache_dir), MPLBACKEND="Agg"),
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0 and res.stdout.strip().endswith("all blocks ran"), res.stdout[-4000:] + res.stderr[-8000:]


@pytest.mark.parametrize("chain", _params("cpp"))
def test_cpp_blocks_build_as_written(chain, tmp_path, cache_dir):
    head = chain[0]
    why = _missing(head.needs)
    if why:
        pytest.skip(f"{head.page}:{head.line}: {why}")
    from opbuilder import CustomOpBuilder, build_library
    src = tmp_path / "snippet.cpp"
    src.write_text("".join(b.code for b in chain))
    name = "doc_" + re.sub(r"\W", "_", Path(head.page).stem) + f"_{head.line}"
    flags = ["-Wall", "-Wextra", "-Werror"]
    if re.search(r"^\s*(OB_MODULE|PYBIND11_MODULE)\(", src.read_text(), re.M):
        module = CustomOpBuilder(name, [src], cflags=flags).load()
        assert module.__name__.endswith(name)
    else:
        lib = build_library(name, [src], cflags=flags)
        assert Path(lib).is_file()


def test_every_block_is_collected():
    """The fence pattern finds every block the page opens (an indented or mistyped fence would be missed)."""
    for page in PAGES:
        text = page.read_text()
        opened = len(re.findall(r"^[ \t]*```(?:python|cpp)[ \t]*$", text, re.M))
        assert opened == sum(len(chain) for chain in _blocks(page)), page
