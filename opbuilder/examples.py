"""Where the example operators (custom_src/) are: beside the package in a
checkout, inside it (opbuilder/custom_src) in an installed wheel."""
from __future__ import annotations

from pathlib import Path

__all__ = ["example_source"]

_PKG = Path(__file__).resolve().parent


def example_source(filename: str) -> Path:
    for root in (_PKG / "custom_src", _PKG.parent / "custom_src"):
        if (root / filename).is_file():
            return root / filename
    raise FileNotFoundError(f"example operator source {filename} not found next to {_PKG}")
