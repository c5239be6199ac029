"""Containers: ``SequentialCell`` (runs its cells in order) and ``CellList`` (holds them).

Their cells are registered under "0", "1", ..., so parameter paths read
``body.0.weight`` as in MindSpore.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterable, Iterator, Union

from .cell import Cell, keeping_names

__all__ = ["SequentialCell", "CellList"]


def _cell(c: Any, where: str) -> Cell:
    if not isinstance(c, Cell):
        raise TypeError(f"{where}: expected a Cell, got {type(c).__name__}")
    return c


class _Indexed(Cell):
    """Cells kept under "0", "1", ... in order."""

    def _reset(self, cells: Iterable[Cell]) -> None:
        """Hold ``cells`` under "0", "1", ... anew, each named by its new path (after this cell's own place)."""
        prefix = self._own_prefix()
        for name in list(self._cells):
            delattr(self, name)
        with keeping_names():
            for i, c in enumerate(cells):
                setattr(self, str(i), c)
        if self._auto_prefix:
            self._name_parameters(prefix)

    def __len__(self) -> int:
        return len(self._cells)

    def __iter__(self) -> Iterator[Cell]:
        return iter(list(self._cells.values()))

    def __getitem__(self, index: Union[int, slice]) -> Any:
        cells = list(self._cells.values())
        if isinstance(index, slice):  # a view of cells this one holds: their names stay
            with keeping_names():
                return type(self)(cells[index])
        if isinstance(index, bool) or not isinstance(index, int):
            raise TypeError(f"{type(self).__name__} indices must be ints or slices, got {type(index).__name__}")
        if not -len(cells) <= index < len(cells):
            raise IndexError(f"index {index} is out of range for a {type(self).__name__} of {len(cells)} cells")
        return cells[index]

    def append(self, cell: Cell) -> "_Indexed":
        key = len(self._cells)
        while str(key) in self._cells:  # an OrderedDict's own names ("1", "2"): never replace one
            key += 1
        setattr(self, str(key), _cell(cell, f"{type(self).__name__}.append"))
        return self

    def extend(self, cells: Iterable[Cell]) -> "_Indexed":
        for c in cells:
            self.append(c)
        return self

    def insert(self, index: int, cell: Cell) -> None:
        cells = list(self._cells.values())
        cells.insert(index, _cell(cell, f"{type(self).__name__}.insert"))
        self._reset(cells)


class SequentialCell(_Indexed):
    """``SequentialCell([a, b, c])`` (or ``SequentialCell(a, b, c)``, or an OrderedDict of named cells)
    computes c(b(a(x)))."""

    def __init__(self, *args: Any) -> None:
        super().__init__()
        if len(args) == 1 and isinstance(args[0], OrderedDict):
            for name, c in args[0].items():
                setattr(self, name, _cell(c, "SequentialCell"))
            return
        cells = list(args[0]) if len(args) == 1 and isinstance(args[0], (list, tuple)) else list(args)
        for i, c in enumerate(cells):
            setattr(self, str(i), _cell(c, "SequentialCell"))

    def construct(self, x: Any) -> Any:
        for c in self._cells.values():
            x = c(x)
        return x


class CellList(_Indexed):
    """A list of cells whose parameters belong to the owner; it has no ``construct`` of its own."""

    def __init__(self, args: Iterable[Cell] = ()) -> None:
        super().__init__()
        for i, c in enumerate(args):
            setattr(self, str(i), _cell(c, "CellList"))
