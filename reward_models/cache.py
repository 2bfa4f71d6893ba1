"""What reference files decode to, kept in memory: a reward reads the same source image, mask or
reference recording for many samples of a run, and decoding it once per sample would dominate its
cost.

A file is keyed by its absolute path and modification time, so a file rewritten in place is read
again; readers in reward worker threads may share one cache.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class FileCache(Generic[T]):
    """Values computed from files, keyed by (absolute path, ``variant``, modification time).

    Args:
        load: ``(absolute path, *variant) -> value``; its errors reach the caller of :meth:`get`
            unchanged (a missing file is the loader's to report).
        max_items: at most this many values are kept, the least recently used dropped first;
            None keeps every one.
    """

    def __init__(self, load: Callable[..., T], max_items: int | None = None) -> None:
        self.load, self.max_items = load, max_items
        self.items: OrderedDict[tuple, T] = OrderedDict()
        self.lock = threading.Lock()
        self.loads = 0  # files loaded so far (for tests and benchmarks)

    def get(self, path: str | os.PathLike, *variant: Hashable) -> T:
        """The value of ``path`` read as ``variant`` (e.g. an image mode), loaded on first use."""
        name = os.path.abspath(path)
        try:
            stamp = os.stat(name).st_mtime_ns
        except OSError:
            stamp = -1  # a missing file: the loader reports it
        key = (name, *variant, stamp)
        with self.lock:
            if key in self.items:
                self.items.move_to_end(key)
                return self.items[key]
        # loaded outside the lock: two threads may both load a new file, neither waits on the other
        value = self.load(name, *variant)
        with self.lock:
            self.loads += 1
            self.items[key] = value
            while self.max_items is not None and len(self.items) > self.max_items:
                self.items.popitem(last=False)
        return value
