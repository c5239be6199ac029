"""Writing ``build.ninja`` for one operator, and reading the depfiles it leaves.

One object per source (named by stem plus a hash of its path, so two
``ops.cpp`` in different folders do not collide), depfiles kept next to the
objects, one link step.
"""
from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence

__all__ = ["Step", "object_name", "write_build_file", "parse_depfile"]


@dataclass(frozen=True)
class Step:
    source: Path
    obj: str  # relative to the build directory
    rule: str  # "cxx" or "cuda"


def object_name(source: Path) -> str:
    tag = hashlib.blake2b(str(source).encode(), digest_size=4).hexdigest()
    return f"obj/{source.stem}-{tag}.o"


def _ninja_path(p: str) -> str:
    return p.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def _cmd(args: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in args).replace("$", "$$")


def write_build_file(path: Path, steps: Sequence[Step], output: str, cxx: Sequence[str], cxx_flags: Sequence[str],
                     nvcc: Sequence[str], cuda_flags: Sequence[str], link_flags: Sequence[str]) -> None:
    lines: List[str] = ["ninja_required_version = 1.3", ""]
    lines += [
        "rule cxx",
        f"  command = {_cmd(cxx)} -MMD -MF $out.d {_cmd(cxx_flags)} -c $in -o $out",
        "  depfile = $out.d",
        "  description = compiling $srcname",
        "",
    ]
    if any(s.rule == "cuda" for s in steps):
        lines += [
            "rule cuda",
            f"  command = {_cmd(nvcc)} -MD -MF $out.d {_cmd(cuda_flags)} -c $in -o $out",
            "  depfile = $out.d",
            "  description = compiling $srcname (nvcc)",
            "",
        ]
    lines += [
        "rule link",
        f"  command = {_cmd(cxx)} -shared -o $out $in {_cmd(link_flags)}",
        "  description = linking $out",
        "",
    ]
    for s in steps:
        lines.append(f"build {_ninja_path(s.obj)}: {s.rule} {_ninja_path(str(s.source))}")
        lines.append(f"  srcname = {s.source.name.replace('$', '$$')}")
    objs = " ".join(_ninja_path(s.obj) for s in steps)
    lines += [f"build {_ninja_path(output)}: link {objs}", f"default {_ninja_path(output)}", ""]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(lines))
    tmp.replace(path)


def parse_depfile(path: Path) -> List[str]:
    """Prerequisites listed in a Make-style depfile (gcc -MMD / nvcc -MD)."""
    text = path.read_text(errors="replace").replace("\\\r\n", " ").replace("\\\n", " ")
    deps: List[str] = []
    seen_colon = False
    token = []
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
                _push("".join(token), deps, seen_colon)
                if not seen_colon and "".join(token).endswith(":"):
                    seen_colon = True
                token = []
            if c == "\n" and seen_colon:
                break  # only the first rule matters (gcc may add phony targets)
            i += 1
            continue
        token.append(c)
        i += 1
    if token:
        _push("".join(token), deps, seen_colon)
    return deps


def _push(tok: str, deps: List[str], seen_colon: bool) -> None:
    if seen_colon:
        deps.append(tok)


def headers_from_depfiles(depfiles: Dict[str, Path], sources: Sequence[Path]) -> List[str]:
    srcs = {str(s) for s in sources}
    out = set()
    for d in depfiles.values():
        for dep in parse_depfile(d):
            p = str(Path(dep).absolute())
            if p not in srcs:
                out.add(p)
    return sorted(out)
