"""The C++ names of a generated kernel: every DSL identifier is mapped here, and only here.

A DSL name (a tensor, scalar, loop or grid index, an inlined callee's renamed local) reaches C++ as
``var(name)``: ``u_`` and the name's *body*, the name with each ``_`` written ``_0`` and each character
outside ASCII letters and digits written ``_1`` and its code point in six hex digits; a body starting
with ``_`` drops the separator so that no result holds ``__`` (``i`` -> ``u_i``, ``i_end`` ->
``u_i_0end``, ``_x`` -> ``u_0x``, ``α`` -> ``u_10003b1``). Why each property holds:

- distinct names give distinct results: after ``u``, a ``_`` and a letter is the separator and the
  body's first letter, a ``_`` and a digit the body's first escape; the escaping is a prefix-free code;
- no result is a C++ keyword, a macro of the headers the prelude includes (``errno``, ``NULL``,
  ``M_PI``, ``assert``...) or one of the generator's fixed names (``params``, ``ob_check``, ``i``):
  none of those starts with ``u_``, and no result holds ``__`` or starts with ``_`` (reserved in C++);
- names the generator derives from a DSL name (``end``, ``size``, ``grid_index``, ``grid_end``,
  ``buffer``) are ``var(name)`` + ``_`` + a tag starting with a letter: a body never holds ``_``
  followed by a letter, so a derived name is never a ``var`` of any name, and reading the body up to
  the first such ``_`` gives back the DSL name, so two derived names are equal only if their names
  and tags are.

The results are ASCII, whatever Python allowed in the name.
"""
from __future__ import annotations

import re
from functools import lru_cache

__all__ = ["var", "end", "size", "grid_index", "grid_end", "buffer", "symbol_stem"]

_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")


@lru_cache(maxsize=4096)
def var(name: str) -> str:
    """The C++ name of the DSL identifier ``name``."""
    body = "".join(c if c in _PLAIN else "_0" if c == "_" else f"_1{ord(c):06x}" for c in name)
    return ("u" if body.startswith("_") else "u_") + body


def end(name: str) -> str:
    """The end bound of the loop over index ``name``."""
    return f"{var(name)}_end"


def size(tensor: str, k: int) -> str:
    """The extent of dimension ``k`` of ``tensor`` (a run-time value)."""
    return f"{var(tensor)}_n{k}"


def grid_index(name: str, k: int) -> str:
    """Coordinate ``k`` of the grid index ``name`` (one C++ loop per dimension)."""
    return f"{var(name)}_d{k}"


def grid_end(name: str, k: int) -> str:
    """The end bound of the loop over coordinate ``k`` of the grid index ``name``."""
    return f"{var(name)}_d{k}_end"


def buffer(tensor: str) -> str:
    """The owning buffer of the temporary ``tensor`` (an ``allocate``)."""
    return f"{var(tensor)}_buf"


def symbol_stem(name: str) -> str:
    """A kernel's name as part of its C symbol: ASCII letters and digits, single ``_`` between them."""
    return re.sub(r"[^0-9A-Za-z]+", "_", name).strip("_")[:40] or "kernel"
