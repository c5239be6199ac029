"""Where a wheel's record of its shipped operators is (cache/shipped.py reads it): looked for on every
load(), so defined in spec.py, which every load() has imported already; here under its old name."""
from __future__ import annotations

from ..spec import RECORD, find_record, no_build

__all__ = ["RECORD", "find_record", "no_build"]
