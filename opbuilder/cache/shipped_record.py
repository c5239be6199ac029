"""Where a wheel's record of its shipped operators is (cache/shipped.py reads it): looked for on every
load(), so here, importing nothing, and a load() with no record near its sources imports nothing of
shipping."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Sequence, Union

__all__ = ["RECORD", "find_record", "no_build"]

RECORD = "opbuilder_ops.json"
_SEARCH_UP = 4  # directories searched for it, from the first source's upwards


def find_record(sources: Sequence[Union[str, os.PathLike]]) -> Optional[Path]:
    """The RECORD in the first source's directory or one of the ``_SEARCH_UP`` above it; None if none."""
    if not sources:
        return None
    d = os.path.dirname(str(sources[0]))
    for _ in range(_SEARCH_UP):
        path = os.path.join(d, RECORD)
        if os.path.isfile(path):
            return Path(path)
        up = os.path.dirname(d)
        if up == d:
            break
        d = up
    return None


def no_build() -> bool:
    """``OPBUILDER_NO_BUILD=1``: a build that would be needed is a NoBuildError."""
    return os.environ.get("OPBUILDER_NO_BUILD", "") not in ("", "0")
