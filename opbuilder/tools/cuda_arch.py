"""Which GPU architectures an nvcc build targets, as ``-gencode`` flags.

``cuda_arch=`` (an option of ``CustomOpBuilder`` and ``load_inline``) is
turned into ``-gencode`` flags in ``cuda_cflags`` (``option_flags``), so it
comes first. Then, in order: none of ours when the user's ``cuda_cflags`` already choose
(``-gencode``, ``-arch``, ``-code`` and their long forms); else
``OPBUILDER_CUDA_ARCH_LIST`` (``TORCH_CUDA_ARCH_LIST`` when ours is unset);
else the architectures of the GPUs ``nvidia-smi`` lists, with PTX for the
newest (gpu_probe.py: asked once, remembered); else ``DEFAULT``. The flags are
part of the nvcc command line and so of the cache key.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import List, NamedTuple, Optional, Sequence, Tuple

__all__ = ["Arch", "ENV", "TORCH_ENV", "DEFAULT", "ACCEPTED", "parse_arch_list", "user_sets_arch",
           "gencode_flags", "arch_flags", "option_flags"]

ENV = "OPBUILDER_CUDA_ARCH_LIST"
TORCH_ENV = "TORCH_CUDA_ARCH_LIST"
ACCEPTED = ("compute capabilities separated by ';', ',' or spaces, each '8.6', '86' or 'sm_86' (an 'a' or 'f' "
            "suffix allowed: '9.0a'), optionally with '+PTX' ('8.6+PTX'), or a name: "
            + ", ".join(("Turing", "Ampere", "Ada", "Hopper", "Blackwell")))


class Arch(NamedTuple):
    """One target: compute capability ``major.minor`` (+ ``suffix`` "a"/"f"), with PTX or not."""
    major: int
    minor: int
    suffix: str
    ptx: bool

    @property
    def number(self) -> str:
        return f"{self.major}{self.minor}{self.suffix}"


# Built without a visible GPU: machine code for compute capability 8.0 (A100; every nvcc from 11.0 to 13
# supports it, and it runs on 8.x devices) plus its PTX, which the driver compiles at load time for any
# newer device (9.0, 10.x, 12.x). Turing (7.5) and older need OPBUILDER_CUDA_ARCH_LIST.
DEFAULT: Tuple[Arch, ...] = (Arch(8, 0, "", True),)

_NAMES = {"turing": ("7.5",), "ampere": ("8.0", "8.6"), "ada": ("8.9",), "hopper": ("9.0",),
          "blackwell": ("10.0", "12.0"), "volta": ("7.0",), "pascal": ("6.0", "6.1")}
_DOTTED = re.compile(r"(\d+)\.(\d)([af]?)")
_NUMBER = re.compile(r"(?:sm_)?(\d+)(\d)([af]?)")
# options whose next word belongs to another tool (the host compiler, ptxas, the linker), not nvcc's arch
_PASS_THROUGH = {"-Xcompiler", "--compiler-options", "-Xptxas", "--ptxas-options", "-Xlinker", "--linker-options",
                 "-Xnvlink", "--nvlink-options", "-Xfatbin", "--fatbin-options", "-Xarchive", "--archive-options",
                 "-D", "-U", "-I", "-isystem", "-include", "-o", "-ccbin", "--compiler-bindir"}
_ARCH_OPTIONS = ("-gencode", "--generate-code", "-arch", "--gpu-architecture", "-code", "--gpu-code")


def _entry(word: str, var: str) -> List[Arch]:
    base, plus, rest = word.partition("+")
    ptx = bool(plus)
    if plus and rest.upper() != "PTX":
        raise ValueError(f"{var}: {word!r} is not an architecture; accepted: {ACCEPTED}")
    if base.lower() in _NAMES:
        caps = _NAMES[base.lower()]
        # PTX (when asked for) of the newest only, as for a list
        return [a._replace(ptx=ptx and i == len(caps) - 1) for i, c in enumerate(caps) for a in _entry(c, var)]
    m = _DOTTED.fullmatch(base) or _NUMBER.fullmatch(base.lower())
    if m is None:
        raise ValueError(f"{var}: {word!r} is not an architecture; accepted: {ACCEPTED}")
    return [Arch(int(m.group(1)), int(m.group(2)), m.group(3), ptx)]


def parse_arch_list(text: str, var: str = ENV) -> Tuple[Arch, ...]:
    """The targets ``text`` names ("8.0;8.6+PTX", "8.0 9.0", "sm_90"), sorted, each once; a word that
    is not one is a ValueError naming ``var`` and the accepted forms."""
    archs = {}
    for word in re.split(r"[;,\s]+", text.strip()):
        if word:
            for a in _entry(word, var):
                key = (a.major, a.minor, a.suffix)
                archs[key] = a._replace(ptx=a.ptx or (key in archs and archs[key].ptx))
    if not archs:
        raise ValueError(f"{var}={text!r} names no architecture; accepted: {ACCEPTED}")
    return tuple(archs[k] for k in sorted(archs))


def user_sets_arch(flags: Sequence[str]) -> bool:
    """True if nvcc ``flags`` choose architectures themselves (words passed on to other tools do not)."""
    skip = False
    for f in flags:
        if skip:
            skip = False
            continue
        if f in _PASS_THROUGH:
            skip = True
            continue
        if any(f == o or f.startswith(o + "=") for o in _ARCH_OPTIONS):
            return True
    return False


def gencode_flags(archs: Sequence[Arch]) -> List[str]:
    """One ``-gencode`` per target's machine code, and one for each PTX asked for."""
    out = []
    for a in archs:
        out.append(f"-gencode=arch=compute_{a.number},code=sm_{a.number}")
        if a.ptx:
            out.append(f"-gencode=arch=compute_{a.number},code=compute_{a.number}")
    return out


def _from_env() -> Optional[Tuple[Arch, ...]]:
    for var in (ENV, TORCH_ENV):
        text = os.environ.get(var, "")
        if text.strip():
            return parse_arch_list(text, var)
    return None


def arch_flags(user_flags: Sequence[str], state_dir: Optional[Path]) -> Tuple[List[str], str]:
    """The ``-gencode`` flags for an nvcc build, and where they came from (for messages)."""
    if user_sets_arch(user_flags):
        return [], "cuda_cflags"
    archs = _from_env()
    if archs is not None:
        return gencode_flags(archs), ENV if os.environ.get(ENV, "").strip() else TORCH_ENV
    from .gpu_probe import device_archs

    caps = device_archs(state_dir)
    if caps:
        found = parse_arch_list(";".join(caps), "nvidia-smi's compute_cap")
        return gencode_flags(found[:-1] + (found[-1]._replace(ptx=True),)), "the visible GPUs"
    return gencode_flags(DEFAULT), "the default: no GPU visible"


def option_flags(value: object, cuda_cflags: Optional[object]) -> List[str]:
    """``cuda_cflags`` (a list, or a string split on spaces, or None) with the ``-gencode`` flags of
    ``cuda_arch=value`` ("8.0", "8.6;9.0+PTX", "Hopper") added: the build then asks no GPU. A value
    that names no architecture, or ``cuda_cflags`` that choose one too, is a ValueError."""
    if not isinstance(value, str):
        raise ValueError(f"cuda_arch must be a string such as '8.0' or '8.6;9.0+PTX', got {value!r}; "
                         f"accepted: {ACCEPTED}")
    flags = cuda_cflags.split() if isinstance(cuda_cflags, str) else list(cuda_cflags or ())
    if user_sets_arch(flags):
        raise ValueError(f"cuda_arch={value!r} and cuda_cflags that choose architectures (-gencode, -arch, "
                         f"-code) were both given; give one of them")
    return flags + gencode_flags(parse_arch_list(value, "cuda_arch"))
