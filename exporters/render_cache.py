"""Render once per published snapshot, whoever asks and however often.

Scrapers, the status page and the snapshot API all read the same immutable snapshot; rendering it
once per (snapshot, variant) keeps a burst of requests from costing a burst of CPU on a GPU node,
and keeping only the newest snapshot's renderings bounds the memory.
"""

from __future__ import annotations

import threading
from typing import Callable, Hashable

from agent.model import NodeSnapshot


class PerSnapshotCache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[tuple[tuple[int, float], Hashable], bytes] = {}

    def peek(self, snapshot: NodeSnapshot, variant: Hashable) -> bytes | None:
        """The rendering if it is already made, else None (the caller renders it somewhere it may take time)."""
        return self._cache.get(((snapshot.sequence, snapshot.ts), variant))

    def get(self, snapshot: NodeSnapshot, variant: Hashable, render: Callable[[NodeSnapshot], bytes]) -> bytes:
        # The timestamp too: snapshots from two publishers (the driver wait, then the collector)
        # may share a sequence number, never a sequence number and a time.
        identity = (snapshot.sequence, snapshot.ts)
        key = (identity, variant)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        with self._lock:  # one rendering per snapshot even when many requests arrive at once
            cached = self._cache.get(key)
            if cached is None:
                cached = render(snapshot)
                self._cache = {k: v for k, v in self._cache.items() if k[0] == identity}
                self._cache[key] = cached
        return cached
