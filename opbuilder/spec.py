"""What to build: the validated description of one operator build."""
from __future__ import annotations

import keyword
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence, Tuple, Union

from .relocate import clean_path

__all__ = ["BuildSpec", "make_spec", "BACKENDS", "CXX_SUFFIXES", "CUDA_SUFFIXES", "MAX_NAME"]

BACKENDS = ("CPU", "GPU")
CXX_SUFFIXES = (".cpp", ".cc", ".cxx", ".c++", ".C")
CUDA_SUFFIXES = (".cu",)
MAX_NAME = 100  # characters in an operator name: with suffixes and temporary-file parts, well under 255
PathLike = Union[str, Path]


@dataclass(frozen=True)
class BuildSpec:
    name: str
    sources: Tuple[Path, ...]
    backend: str
    kind: str  # "module": a pybind11 extension; "library": a plain shared library (aot ops)
    include_paths: Tuple[Path, ...]
    cflags: Tuple[str, ...]
    cuda_cflags: Tuple[str, ...]
    ldflags: Tuple[str, ...]
    debug: bool
    verbose: bool
    root: Path

    @property
    def op_dir(self) -> Path:
        """Per-operator directory: objects, dependency manifests, published builds."""
        return self.root / (self.name if self.kind == "module" else f"{self.name}.lib")


def _as_list(value: Optional[Union[str, Iterable[str]]], what: str) -> Tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(value.split())
    out = tuple(value)
    for v in out:
        if not isinstance(v, str):
            raise TypeError(f"{what} must be strings, got {type(v).__name__}: {v!r}")
    return out


def make_spec(name: str, sources: Union[PathLike, Sequence[PathLike]], backend: str, kind: str,
              include_paths: Optional[Sequence[PathLike]], cflags, cuda_cflags, ldflags,
              debug: bool, verbose: bool, root: Path) -> BuildSpec:
    """Check the user's arguments and resolve paths; errors say what to change."""
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise ValueError(f"operator name {name!r} must be a valid Python identifier (it becomes the module name)")
    if not name.isascii():
        # Python looks for PyInitU_<punycode> in a module with a non-ASCII name, which PYBIND11_MODULE never defines
        raise ValueError(f"operator name {name!r} must be ASCII (letters, digits, _): Python cannot import an "
                         f"extension module with a non-ASCII name")
    if len(name) > MAX_NAME:
        raise ValueError(f"operator name {name[:20]}... is {len(name)} characters long; at most {MAX_NAME} are "
                         f"accepted (it names files in the cache, whose names the file system limits)")
    if not isinstance(backend, str) or backend.upper() not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; accepted values: {', '.join(map(repr, BACKENDS))} (the "
                         f"{backend} backend is not available: opbuilder builds for these backends only)")
    backend = backend.upper()
    if isinstance(sources, (str, Path)):
        sources = [sources]
    srcs = []
    for s in sources:
        p = Path(clean_path(str(Path(s).expanduser().absolute())))
        if not p.is_file():
            raise FileNotFoundError(f"source file of operator '{name}' not found: {s}")
        suffixes = CXX_SUFFIXES + (CUDA_SUFFIXES if backend == "GPU" else ())
        if p.suffix not in suffixes:
            hint = " (.cu sources need backend='GPU')" if p.suffix in CUDA_SUFFIXES else ""
            raise ValueError(f"source {s} of operator '{name}' has an unsupported suffix{hint}; "
                             f"accepted: {', '.join(suffixes)}")
        srcs.append(p)
    if not srcs:
        raise ValueError(f"operator '{name}' has no sources")
    if len(set(srcs)) != len(srcs):
        raise ValueError(f"operator '{name}' lists a source twice")
    incs = []
    for inc in include_paths or ():
        p = Path(clean_path(str(Path(inc).expanduser().absolute())))
        if not p.is_dir():
            raise FileNotFoundError(f"include path of operator '{name}' is not a directory: {inc}")
        incs.append(p)
    return BuildSpec(name=name, sources=tuple(srcs), backend=backend, kind=kind, include_paths=tuple(incs),
                     cflags=_as_list(cflags, "cflags"), cuda_cflags=_as_list(cuda_cflags, "cuda_cflags"),
                     ldflags=_as_list(ldflags, "ldflags"), debug=bool(debug), verbose=bool(verbose), root=root)
