"""Neural-network building blocks: ``Cell``."""
from .cell import Cell

__all__ = ["Cell"]
