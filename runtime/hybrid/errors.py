"""Errors of the hybrid DSL, each naming the file and line of the user's source."""
from __future__ import annotations

__all__ = ["HybridError", "HybridSyntaxError", "HybridTypeError", "HybridOverflowError", "negative_size_message"]


class HybridError(Exception):
    """A hybrid kernel cannot be compiled; ``filename``/``lineno`` say where in the user's source."""

    def __init__(self, message: str, filename: str = "<unknown>", lineno: int = 0) -> None:
        self.filename = filename
        self.lineno = lineno
        self.reason = message
        super().__init__(f"{filename}:{lineno}: {message}")


class HybridSyntaxError(HybridError, SyntaxError):
    """A construct the DSL does not have (``while``, ``break``, an unknown function, ...)."""

    def __str__(self) -> str:  # SyntaxError's own formatting would repeat the location
        return self.args[0]


class HybridTypeError(HybridError, TypeError):
    """A construct used with the wrong kind of value (a tensor indexed with too few indices, ...)."""


class HybridOverflowError(HybridError, OverflowError):
    """A Python int constant that does not fit the integer dtype numpy would convert it to (``x[i] + 300``
    for an int8 ``x``): numpy raises OverflowError when the line runs; the compiled target refuses the
    kernel for those dtypes when it is generated."""


def negative_size_message(filename: str, lineno: int, what: str, kernel: str) -> str:
    """The ValueError message of an ``output_tensor``/``allocate`` (``what``) given a negative size, the same
    in both targets and in the output shapes ``ops.Custom`` infers (numpy's own words, with the place)."""
    return f"{filename}:{lineno}: {what}(...): negative dimensions are not allowed (in hybrid kernel '{kernel}')"
