"""Writing ``build.ninja`` for one build of one operator, and reading the depfiles it leaves.

The builder decides what is stale from content records (``publish.py``), so
the file lists only the objects to compile now and the link (of every
object). Objects that are current
appear only as inputs of the link: ninja's own timestamp logic never
recompiles a source whose contents did not change. One object per source,
named by stem plus a hash of its path (two ``ops.cpp`` in different folders
do not collide); depfiles (``-MD``: every file read, system headers too; search_path.py picks
what is tracked) next to the objects.
"""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Dict, Iterable, List, Sequence, Tuple

from ..cache.relocate import clean_path
from ..cache.trust import write_file

__all__ = ["Step", "write_build_file", "parse_depfile", "depfile_inputs"]


class Step:
    """Compile one source into ``obj`` (relative to the build directory) with ``rule`` and extra flags."""

    __slots__ = ("source", "obj", "rule", "extra")

    def __init__(self, source: Path, obj: str, rule: str, extra: Tuple[str, ...] = ()) -> None:
        self.source, self.obj, self.rule, self.extra = source, obj, rule, extra


def _path(p: str) -> str:
    return p.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def _cmd(args: Iterable[str]) -> str:
    return " ".join(shlex.quote(a) for a in args).replace("$", "$$")


def write_build_file(path: Path, compile_steps: Sequence[Step], all_objects: Sequence[str], output: str,
                     cxx: Sequence[str], cxx_flags: Sequence[str], nvcc: Sequence[str], cuda_flags: Sequence[str],
                     link_flags: Sequence[str], launcher: Sequence[str] = ()) -> None:
    """The build file: compile ``compile_steps`` (each through ``launcher``, if any: sccache, ccache),
    then link ``all_objects`` into ``output``."""
    lines: List[str] = ["ninja_required_version = 1.3", ""]
    lines += ["rule cxx",
              f"  command = {_cmd((*launcher, *cxx))} -MD -MF $out.d {_cmd(cxx_flags)} $extra -c $in -o $out",
              "  description = compiling $srcname", ""]
    if any(s.rule == "cuda" for s in compile_steps):
        lines += ["rule cuda",
                  f"  command = {_cmd((*launcher, *nvcc))} -MD -MF $out.d {_cmd(cuda_flags)} -c $in -o $out",
                  "  description = compiling $srcname (nvcc)", ""]
    lines += ["rule link", f"  command = {_cmd(cxx)} -shared -o $out $in {_cmd(link_flags)}",
              "  description = linking $out", ""]
    for s in compile_steps:
        lines.append(f"build {_path(s.obj)}: {s.rule} {_path(str(s.source))}")
        lines.append(f"  srcname = {s.source.name.replace('$', '$$')}")
        if s.extra:
            lines.append(f"  extra = {_cmd(s.extra)}")
    objs = " ".join(_path(o) for o in all_objects)
    lines += [f"build {_path(output)}: link {objs}", f"default {_path(output)}", ""]
    write_file(path, "\n".join(lines).encode())


def parse_depfile(path: Path) -> List[str]:
    """Prerequisites listed in a Make-style depfile (gcc / nvcc -MD)."""
    text = path.read_text(errors="replace").replace("\\\r\n", " ").replace("\\\n", " ")
    deps: List[str] = []
    seen_colon = False
    token: List[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text) and text[i + 1] in " #\\":
            token.append(text[i + 1])
            i += 2
            continue
        if c == "$" and i + 1 < len(text) and text[i + 1] == "$":
            token.append("$")
            i += 2
            continue
        if c.isspace():
            if token:
                tok = "".join(token)
                if seen_colon:
                    deps.append(tok)
                elif tok.endswith(":"):
                    seen_colon = True
                token = []
            if c == "\n" and seen_colon:
                break  # only the first rule matters (gcc may add phony targets)
            i += 1
            continue
        token.append(c)
        i += 1
    if token and seen_colon:
        deps.append("".join(token))
    return deps


def depfile_inputs(depfile: Path, build_dir: Path, skip_under: Path) -> List[str]:
    """Absolute paths of an object's inputs from its depfile, without files the builder itself
    wrote under ``skip_under`` (the precompiled header, the module-name header)."""
    out: Dict[str, None] = {}
    skip = str(skip_under) + "/"
    for dep in parse_depfile(depfile):
        p = Path(dep)
        if not p.is_absolute():
            p = build_dir / p
        s = clean_path(str(p))
        if not s.startswith(skip):
            out[s] = None
    return list(out)
