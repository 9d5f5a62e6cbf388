"""The driver's account of every record handed to the replicas: queued, held by a replica, or done.

Exactly once rests on two rules (jobs/replicas.py uses this class):
- a record's result is accepted once (`done` returns it the first time only), and only the driver
  writes output, so a record computed twice (see below) is still written once;
- no record is lost: when a replica dies, every record that left the work queue and is not held by
  a live replica is queued again (`lost`). A replica reports each record it takes, but it may die
  between taking one and reporting it; the work queue is FIFO and only the driver puts, so the
  records that left it are exactly the first (puts - queue size) puts. A live replica whose report
  is still on its way may then compute a record twice: wasted work, never a duplicate line.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any


class WorkLedger:
    """Outstanding records by key (an int the driver assigns), their holders and the put order."""

    def __init__(self) -> None:
        # Records not done yet: key -> the caller's item.
        self.outstanding: dict[int, Any] = {}
        # Key -> the replica slot that reported taking it (slot: any hashable, e.g. (index, incarnation)).
        self.holders: dict[int, Hashable] = {}
        # Every put into the work queue in order: a key, or None for a stop marker.
        self.puts: list[int | None] = []
        # Key -> position of its latest put.
        self._last_put: dict[int, int] = {}
        self._next_key = 0

    def add(self, item: Any) -> int:
        """Register a new record; returns its key (put it with `put`)."""
        key = self._next_key
        self._next_key += 1
        self.outstanding[key] = item
        return key

    def put(self, key: int | None) -> None:
        """Note a put into the work queue (None: a stop marker), in the order the queue receives them."""
        if key is not None:
            self._last_put[key] = len(self.puts)
        self.puts.append(key)

    def taken(self, key: int, slot: Hashable) -> None:
        """A replica reported taking the record (ignored once it is done)."""
        if key in self.outstanding:
            self.holders[key] = slot

    def done(self, key: int) -> Any | None:
        """The record's item the first time its result arrives; None for a repeat."""
        self.holders.pop(key, None)
        return self.outstanding.pop(key, None)

    def held_by(self, slot: Hashable) -> list[int]:
        return [key for key, holder in self.holders.items() if holder == slot]

    def lost(self, dead: set[Hashable], num_taken: int) -> list[int]:
        """Records to queue again after the slots in `dead` died: outstanding, out of the queue (put
        among the first `num_taken` puts) and not held by a live slot. Their holders are cleared."""
        keys = [
            key
            for key in self.outstanding
            if self._last_put.get(key, len(self.puts)) < num_taken
            and (key not in self.holders or self.holders[key] in dead)
        ]
        for key in keys:
            self.holders.pop(key, None)
        return keys

    @property
    def num_outstanding(self) -> int:
        return len(self.outstanding)
