"""Errors the builder raises."""
from __future__ import annotations

from typing import Optional

__all__ = ["BuildError", "UnsafeCacheDirError"]


class BuildError(RuntimeError):
    """Compiling, linking or importing an operator failed.

    The message leads with the operator name and the compiler's first errors
    (file:line); ``log`` holds the whole output and ``log_path`` where it is kept.
    """

    def __init__(self, message: str, *, name: str, log: str = "", log_path: Optional[str] = None) -> None:
        super().__init__(message)
        self.name = name
        self.log = log
        self.log_path = log_path


class UnsafeCacheDirError(PermissionError):
    """The cache directory could be written by another user, so nothing in it is trusted."""
