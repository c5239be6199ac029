"""``Check``: one finding of ``python -m opbuilder doctor`` (doctor.py and doctor_cuda.py make them)."""
from __future__ import annotations

from typing import List, Optional

__all__ = ["Check"]


class Check:
    """One finding: ``status`` is "ok", "error" or "note"; ``fix`` says what to do about a problem."""

    def __init__(self, what: str, status: str, detail: str, fix: Optional[str] = None) -> None:
        self.what, self.status, self.detail, self.fix = what, status, detail, fix

    def lines(self) -> List[str]:
        out = [f"{self.status:5s} {self.what}: {self.detail}"]
        if self.fix:
            out.append(f"      fix: {self.fix}")
        return out
