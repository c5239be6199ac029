"""What a kind of build output adds to a build plan (``Target``): the builder's plan reads it, and
a build kind defined outside the builder (to_torch's bridge, torch_bridge_build.py) returns one without
importing the builder."""
from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

__all__ = ["Target"]


class Target(NamedTuple):
    """What the kind of output (a nanobind or pybind11 module, nanobind's runtime, a plain library)
    adds to a plan."""

    output: str
    binding: Optional[str] = None
    system: Tuple[str, ...] = ()  # -isystem pairs after opbuilder's own
    places: Tuple[Tuple[str, str], ...] = ()  # (include directory, its name in keys and path maps)
    defines: Tuple[str, ...] = ()  # nvcc's -D flags (a C++ source gets the name from a generated header)
    binding_defines: Tuple[str, ...] = ()  # -D flags of every compile
    visibility: Tuple[str, ...] = ()
    identity: Tuple[str, ...] = ()  # key parts after the common ones
    reads_headers: bool = True  # False: opbuilder's headers are not read, so not keyed
    pch_identity: Tuple[str, ...] = ()  # a pybind11 module's PCH key parts besides the compiler's
    link: Tuple[str, ...] = ()  # link flags before the user's ldflags
