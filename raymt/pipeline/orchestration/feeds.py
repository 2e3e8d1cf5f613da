"""What the driver sends decoders, one item at a time, never blocking its loop: the encoder pool's
stream of encoded blocks read ahead by a thread into a bounded queue (``BlockFeed``), or the units
themselves when there is no encoder pool (``ListFeed``). Both end with ``DRAINED``; a stream that
fails ends early with its ``error`` set, and the driver's sweep sends what it did not deliver."""
from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator

from raymt.pipeline.errors import last_line

DRAINED = object()  # the feed has nothing more to give


class BlockFeed:
    """A thread that iterates the encoder stream into a bounded queue; ``next`` never blocks."""

    def __init__(self, blocks: Callable[[], Iterator[object]], maxsize: int) -> None:
        self.queue: queue.Queue = queue.Queue(maxsize)
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(blocks,), name="raymt-encoded-blocks", daemon=True)
        self._thread.start()

    def _run(self, blocks: Callable[[], Iterator[object]]) -> None:
        try:
            for ref in blocks():
                if not self._put(ref):
                    return
        except Exception as e:  # noqa: BLE001 - the sweep sends what the stream did not deliver
            self.error = f"{type(e).__name__}: {last_line(e)}"
        self._put(DRAINED)

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self.queue.put(item, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    def next(self) -> object | None:
        try:
            return self.queue.get_nowait()
        except queue.Empty:
            return None

    def close(self) -> None:
        self._stop.set()


class ListFeed:
    """Units to send raw (no encoder pool), in order; then ``DRAINED``."""

    def __init__(self, items: list) -> None:
        self.items, self.error = deque(items), None

    def next(self) -> object:
        return self.items.popleft() if self.items else DRAINED

    def close(self) -> None:
        self.items.clear()
