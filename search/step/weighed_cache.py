"""A least-recently-used map bounded by the weight of what it holds, not by how many entries it has.

``functools.lru_cache(maxsize=N)`` bounds entries; when the values (or keys) differ in size by orders of
magnitude, as allocation streams do (an OPT-125m SFT step is a few thousand events, a PPO step of four
1.3B-parameter models more than fifty thousand), N entries of the largest ones are what a long-running process
(``planner tune``, an API user planning many jobs, the prediction snapshot) ends up holding. This map keeps
the most recently used values whose weights sum to at most ``budget``: what it holds stays bounded whatever
the jobs are.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class WeighedCache(Generic[K, V]):
    """Least recently used entries whose ``weight`` sums to at most ``budget`` (a value heavier than the whole
    budget is not kept)."""

    def __init__(self, budget: int, weight: Callable[[V], int]) -> None:
        self.budget = budget
        self._weight = weight
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._held = 0

    @property
    def held(self) -> int:
        """The weight of the values held now (at most :attr:`budget`)."""
        return self._held

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> V | None:
        """The value kept for ``key`` (now the most recently used), or None."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: K, value: V) -> None:
        """Keep ``value`` for ``key``, dropping the least recently used entries until the budget holds."""
        old = self._entries.pop(key, None)
        if old is not None:
            self._held -= old[1]
        weight = self._weight(value)
        if weight > self.budget:
            return
        self._entries[key] = (value, weight)
        self._held += weight
        while self._held > self.budget:
            _, (_, dropped) = self._entries.popitem(last=False)
            self._held -= dropped

    def clear(self) -> None:
        """Drop every entry."""
        self._entries.clear()
        self._held = 0
