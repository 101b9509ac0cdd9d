"""One bench row: a paired measurement, what it is compared with, and its target.

Rule: its own module so every row maker (``bench.main``, ``bench.wrapper``, ...) imports it from
below; none of them imports another, so the bench has no import circle.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.timing import Pair


@dataclass(frozen=True, slots=True)
class Row:
    label: str
    base: str
    pair: Pair
    target: float | None = None  # None: shown for information

    @property
    def passed(self) -> bool | None:
        return None if self.target is None else self.pair.ratio <= self.target
