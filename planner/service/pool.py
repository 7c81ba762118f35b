"""The server's bounded work: a fixed pool of worker threads with a short waiting line. A request that
finds the line full is turned away at once (503 with Retry-After) instead of waiting unboundedly; one
that runs past the request timeout is answered 504 while its thread finishes (and keeps its place,
so the pool stays bounded). Answers of identical requests are kept in a small LRU cache: every
action is a deterministic function of its request."""

import asyncio
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

__all__ = ["AnswerCache", "Busy", "WorkPool"]


class Busy(Exception):
    """Every worker is busy and the waiting line is full."""


class WorkPool:
    def __init__(self, workers: int, backlog: int, timeout_s: float):
        self.workers, self.capacity, self.timeout_s = workers, workers + backlog, timeout_s
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="planner-serve")
        self._admitted = 0
        self._lock = threading.Lock()

    @property
    def admitted(self) -> int:
        return self._admitted

    def _release(self, _future=None) -> None:
        with self._lock:
            self._admitted -= 1

    async def run(self, function: Callable, *args) -> object:
        """`function(*args)` on a worker thread; Busy when the pool and its line are full,
        asyncio.TimeoutError past the timeout."""
        with self._lock:
            if self._admitted >= self.capacity:
                raise Busy()
            self._admitted += 1
        try:
            future = self._executor.submit(function, *args)
        except RuntimeError:  # shut down
            self._release()
            raise Busy() from None
        future.add_done_callback(self._release)
        return await asyncio.wait_for(asyncio.wrap_future(future), self.timeout_s)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


class AnswerCache:
    """The last `size` answers by request (action name and the request's canonical JSON)."""

    def __init__(self, size: int):
        self.size = size
        self._answers: OrderedDict[str, tuple[str, bytes]] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(action: str, canonical: bytes) -> str:
        return hashlib.sha256(action.encode() + b"\0" + canonical).hexdigest()

    def get(self, key: str) -> tuple[str, bytes] | None:
        with self._lock:
            answer = self._answers.get(key)
            if answer is not None:
                self._answers.move_to_end(key)
            return answer

    def put(self, key: str, answer: tuple[str, bytes]) -> None:
        if self.size <= 0:
            return
        with self._lock:
            self._answers[key] = answer
            self._answers.move_to_end(key)
            while len(self._answers) > self.size:
                self._answers.popitem(last=False)
