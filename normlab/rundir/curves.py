"""One metric's points over training, stored as columns: ``Curve``.

A run's ``metrics.jsonl`` can hold millions of numbers (the cap is 256 MiB); as a list of ``(step, value)`` tuples
each point costs about 120 bytes of Python objects, as two typed arrays (``array('q')`` steps, ``array('d')``
values) 16. ``Curve`` is a read-only sequence of ``(step, value)`` tuples (``len``, indexing, slicing, iteration,
``sorted``, ``dict(curve)``: whatever reads a list of points reads a curve), built with ``add`` and put in step order
with ``sort``; ``steps`` and ``values`` are the columns themselves (a plot hands them over without making a list).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload


class Curve(Sequence):
    """``(step, value)`` points of one metric: ``steps`` (``array('q')``), ``values`` (``array('d')``)."""

    __slots__ = ("steps", "values")

    def __init__(self, points: Iterable[tuple[int, float]] = ()) -> None:
        self.steps = array("q")
        self.values = array("d")
        for step, value in points:
            self.add(step, value)

    def add(self, step: int, value: float) -> None:
        """Append one point (a step beyond 64 bits is an OverflowError: no trainer logs one)."""
        self.steps.append(step)
        self.values.append(value)

    def append(self, point: tuple[int, float]) -> None:
        """``list.append`` of a ``(step, value)`` point."""
        self.add(*point)

    def sort(self) -> None:
        """Order the points as ``list.sort`` orders ``(step, value)`` tuples; points already in increasing step
        order (a metrics file's own order) are left as they are without copying."""
        s = self.steps
        if all(a < b for a, b in zip(s, s[1:])):
            return
        pts = sorted(self)
        self.steps = array("q", (p[0] for p in pts))
        self.values = array("d", (p[1] for p in pts))

    def __len__(self) -> int:
        return len(self.steps)

    @overload
    def __getitem__(self, i: int) -> tuple[int, float]: ...

    @overload
    def __getitem__(self, i: slice) -> Curve: ...

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            out = Curve()
            out.steps, out.values = self.steps[i], self.values[i]
            return out
        return self.steps[i], self.values[i]

    def __iter__(self) -> Iterator[tuple[int, float]]:
        return zip(self.steps, self.values)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Curve):
            return self.steps == other.steps and self.values == other.values
        if isinstance(other, (list, tuple)):
            return len(other) == len(self) and all(tuple(p) == q for p, q in zip(other, self))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, like a list

    def __repr__(self) -> str:
        head = ", ".join(f"({s}, {v!r})" for s, v in self[:3])
        return f"Curve([{head}{', ...' if len(self) > 3 else ''}], {len(self)} points)"


__all__ = ["Curve"]
