"""Dynamic batching for a translation service: many requests in, few decoding batches out.

Request handlers `submit` their items (sentences) with the settings they decode with and get
a `concurrent.futures.Future`; a worker thread collects the waiting items of one setting
until it has `max_batch_items` of them or the oldest has waited `max_wait_s`, decodes them in
one call, and resolves each request whose items are all decoded (its results in its own
order). Requests with other settings wait for a batch of their own (a batch decodes with one
beam); the oldest waiting request decides which setting goes next, so none starves. A request
larger than a batch is split over several. A cancelled request (a handler that timed out) is
dropped from what waits, and a batch whose requests are all cancelled stops decoding: the
decode function is given `stop()`, which says so, to ask while it works (the server's
generator asks at every step). A batch whose decode raises is decoded again request by
request, so that an item the decode cannot take (a sentence the tokenizer refuses) fails its
own request only; the worker goes on.

Lanes: each request is submitted to one of `lanes` queues, each with its own worker, so that
slow work (the server's constrained searches) never holds up a lane of quick work; within a
lane, requests go in turn as above. The decode function runs on several threads at once only
with more than one lane.

`close()` stops accepting, decodes what is queued without waiting, and ends the workers:
how a server drains on shutdown. Nothing here knows about HTTP, tokenizers or engines: the
decode function is passed in.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")
Setting = TypeVar("Setting")


class BatcherClosed(RuntimeError):
    """`submit` after `close`: the service is shutting down."""


@dataclass
class _Request(Generic[Item, Result, Setting]):
    items: Sequence[Item]
    setting: Setting
    key: Hashable
    future: Future[list[Result]]
    arrived: float
    lane: int = 0
    taken: int = 0  # items handed to a batch so far
    results: list[Any] = field(default_factory=list)  # one per item, filled as batches finish
    done: int = 0  # items decoded so far


@dataclass
class BatcherStats:
    """What the worker has done, for a health endpoint (a snapshot)."""

    requests: int  # submitted
    batches: int  # decode calls made
    items: int  # items decoded
    waiting_items: int  # queued, not yet in a batch
    largest_batch: int


Stop = Callable[[], bool]


class Batcher(Generic[Item, Result, Setting]):
    """Decoding threads (one per lane) fed by many submitters (see the module docstring).

    `decode(items, setting, stop) -> results` (one per item, in order) runs on the worker
    threads only; `stop()` turns True once every request of the batch is cancelled (the decode
    may then raise anything: nobody gets it). `key(setting)` groups settings that may share a
    batch, which decodes with its oldest request's setting: equal keys must mean equal decoding
    (default: the setting itself, hashable).
    """

    def __init__(
        self,
        decode: Callable[[list[Item], Setting, Stop], list[Result]],
        max_batch_items: int,
        max_wait_s: float,
        key: Callable[[Setting], Hashable] = lambda setting: setting,
        name: str = "batcher",
        lanes: int = 1,
    ) -> None:
        if max_batch_items < 1:
            raise ValueError(f"max_batch_items must be >= 1, not {max_batch_items}")
        if lanes < 1:
            raise ValueError(f"lanes must be >= 1, not {lanes}")
        self._decode = decode
        self._key = key
        self.max_batch_items = max_batch_items
        self.max_wait_s = max(0.0, max_wait_s)
        self._waiting: deque[_Request[Item, Result, Setting]] = deque()  # oldest first
        self._lock = threading.Condition()
        self._closed = False
        self._requests = self._batches = self._items = self._largest = 0
        self.lanes = lanes
        self._workers = [
            threading.Thread(target=self._run, args=(lane,), name=name if lane == 0 else f"{name}-{lane}", daemon=True)
            for lane in range(lanes)
        ]
        for worker in self._workers:
            worker.start()

    def submit(self, items: Sequence[Item], setting: Setting, lane: int = 0) -> Future[list[Result]]:
        """A future of `items`' results, in their order, decoded by `lane`'s worker; raises
        BatcherClosed after close()."""
        if not 0 <= lane < self.lanes:
            raise ValueError(f"lane {lane} is not one of this batcher's {self.lanes}")
        future: Future[list[Result]] = Future()
        with self._lock:
            if self._closed:
                raise BatcherClosed("the batcher is closed")
            self._requests += 1
            if not items:
                future.set_result([])
                return future
            self._waiting.append(_Request(list(items), setting, self._key(setting), future, time.monotonic(), lane))
            self._lock.notify_all()
        return future

    def stats(self) -> BatcherStats:
        with self._lock:
            waiting = sum(len(request.items) - request.taken for request in self._waiting)
            return BatcherStats(self._requests, self._batches, self._items, waiting, self._largest)

    def close(self, timeout: float | None = None) -> bool:
        """Stop accepting, decode everything queued, end the workers; False if one is still
        decoding after `timeout` seconds."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        deadline = None if timeout is None else time.monotonic() + timeout
        for worker in self._workers:
            worker.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(worker.is_alive() for worker in self._workers)

    # ------------------------------------------------------------------ the workers
    def _run(self, lane: int) -> None:
        while True:
            batch = self._next_batch(lane)
            if batch is None:
                return
            if batch[0]:  # empty when every request of it was cancelled meanwhile
                self._decode_batch(*batch)

    def _next_batch(self, lane: int) -> tuple[list[tuple[_Request[Item, Result, Setting], int, int]], Any] | None:
        """`lane`'s next batch as (request, start, end) slices and their setting; None once
        closed and drained. Waits, holding no lock while asleep, for items or for the oldest's deadline."""
        with self._lock:
            while True:
                self._drop_cancelled()
                waiting = [request for request in self._waiting if request.lane == lane]
                if not waiting:
                    if self._closed:
                        return None
                    self._lock.wait()
                    continue
                oldest = waiting[0]
                ready = sum(len(r.items) - r.taken for r in waiting if r.key == oldest.key)
                left = oldest.arrived + self.max_wait_s - time.monotonic()
                if ready >= self.max_batch_items or left <= 0 or self._closed:
                    return self._take(oldest.key, lane), oldest.setting
                self._lock.wait(left)

    def _drop_cancelled(self) -> None:
        kept = [request for request in self._waiting if not request.future.cancelled()]
        if len(kept) != len(self._waiting):
            self._waiting = deque(kept)

    def _take(self, key: Hashable, lane: int) -> list[tuple[_Request[Item, Result, Setting], int, int]]:
        """Up to max_batch_items items of `lane`'s requests with `key`, oldest first (lock held)."""
        slices, room = [], self.max_batch_items
        for request in list(self._waiting):
            if room == 0:
                break
            if request.key != key or request.lane != lane or request.future.cancelled():
                continue
            end = min(len(request.items), request.taken + room)
            slices.append((request, request.taken, end))
            room -= end - request.taken
            request.taken = end
            if end == len(request.items):
                self._waiting.remove(request)
        return slices

    def _decode_batch(self, slices: list[tuple[_Request[Item, Result, Setting], int, int]], setting: Any) -> None:
        items = [item for request, start, end in slices for item in request.items[start:end]]

        def abandoned() -> bool:  # every request of the batch cancelled: nobody waits for it
            return all(request.future.cancelled() for request, _, _ in slices)

        try:
            results = self._decode(items, setting, abandoned)
            if len(results) != len(items):
                raise RuntimeError(f"decode returned {len(results)} results for {len(items)} items")
        except Exception as error:  # handed to the request(s) at fault; the worker goes on
            if abandoned():  # stopped (or failed) for nobody: not decoded again
                self._fail([request for request, _, _ in slices], error)
            elif len(slices) == 1:
                self._fail([slices[0][0]], error)
            else:  # which request's items failed is unknown: each decodes alone, once
                for one in slices:
                    self._decode_batch([one], setting)
            return
        with self._lock:
            self._batches += 1
            self._items += len(items)
            self._largest = max(self._largest, len(items))
        offset = 0
        for request, start, end in slices:
            request.results.extend(results[offset : offset + end - start])
            offset += end - start
            request.done += end - start
            if request.done == len(request.items):
                _resolve(request.future, result=request.results)

    def _fail(self, requests: list[_Request[Item, Result, Setting]], error: BaseException) -> None:
        with self._lock:
            for request in requests:
                if request in self._waiting:  # its remaining items will not be decoded either
                    self._waiting.remove(request)
        for request in requests:
            _resolve(request.future, error=error)


def _resolve(future: Future[Any], result: Any = None, error: BaseException | None = None) -> None:
    """Set a future's outcome unless it is already done (the handler may have cancelled it)."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:
        pass
