"""``runtime.mint.nn``: its ``functional`` module (MindSpore's ``mint.nn.functional``)."""
from . import functional  # noqa: F401

__all__ = ["functional"]
