"""Reading a JSON record (a shipped wheel's opbuilder_ops.json, the installed runtime's native.json) with the
C scanner of ``_json``, the json package's accelerator, without importing the json package (its decoder and
encoder modules: ~1 ms of a ~3 ms shipped load, issue 35). A load() reads each record's marshal copy
instead (importer.read_record: no ``_json`` at all); this reads a record written without one (an older
install or wheel), and ``opbuilder doctor``'s."""
from __future__ import annotations

from typing import Any, Callable, Optional

__all__ = ["loads"]

_scan: Optional[Callable[[str, int], Any]] = None  # _json's scanner, made on first use (loads)


class _Context:
    """What ``_json.make_scanner`` reads of a decoder: json.loads's defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__
    memo: dict = {}


def loads(text: str) -> Any:
    """``json.loads(text)`` with the C scanner of ``_json``, the json package's accelerator, without
    importing the json package (its decoder and encoder modules: ~1 ms of a ~3 ms shipped load); a
    ValueError (json.JSONDecodeError) for what is not one JSON document. Where ``_json`` is missing,
    the json package reads it."""
    global _scan
    if _scan is None:
        try:
            from _json import make_scanner
        except ImportError:  # pragma: no cover - an interpreter without the accelerator
            import json
            return json.loads(text)
        _scan = make_scanner(_Context())
    doc = text.strip(" \t\n\r")
    try:
        value, end = _scan(doc, 0)
    except StopIteration:  # nothing that starts a JSON value
        end = -1
    except Exception:  # an error inside the document: _json raises it as json.decoder's JSONDecodeError, and
        end = -1  # a SystemError where json.decoder is not imported (as here): the json package says which
    if end != len(doc):
        import json
        return json.loads(text)  # raises its JSONDecodeError, with the position
    return value
