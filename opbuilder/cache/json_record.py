"""Reading a JSON record (a shipped wheel's opbuilder_ops.json, the installed runtime's native.json) on a
shipped load(): with the C scanner of ``_json``, the json package's accelerator, without importing the
json package (its decoder and encoder modules: ~1 ms of a ~3 ms shipped load, issue 35). ``loads`` is
defined in importer.py, which a shipped load() imports; here under its old name."""
from __future__ import annotations

from ..importer import loads

__all__ = ["loads"]
