"""Dynamic batching for a translation service: many requests in, few decoding batches out.

Request handlers `submit` their items (sentences) with the settings they decode with and get
a `concurrent.futures.Future`; one worker thread, the only one that touches the engine,
collects the waiting items of one setting until it has `max_batch_items` of them or the
oldest has waited `max_wait_s`, decodes them in one call, and resolves each request whose
items are all decoded (its results in its own order). Requests with other settings wait for
a batch of their own (a batch decodes with one beam); the oldest waiting request decides
which setting goes next, so none starves. A request larger than a batch is split over
several. A cancelled request (a handler that timed out) is dropped from what waits. A batch
whose decode raises is decoded again request by request, so that an item the decode cannot
take (a sentence the tokenizer refuses) fails its own request only; the worker goes on.

`close()` stops accepting, decodes what is queued without waiting, and ends the worker:
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


class Batcher(Generic[Item, Result, Setting]):
    """One decoding thread fed by many submitters (see the module docstring).

    `decode(items, setting) -> results` (one per item, in order) runs on the worker thread only.
    `key(setting)` groups settings that may share a batch, which decodes with its oldest
    request's setting: equal keys must mean equal decoding (default: the setting itself, hashable).
    """

    def __init__(
        self,
        decode: Callable[[list[Item], Setting], list[Result]],
        max_batch_items: int,
        max_wait_s: float,
        key: Callable[[Setting], Hashable] = lambda setting: setting,
        name: str = "batcher",
    ) -> None:
        if max_batch_items < 1:
            raise ValueError(f"max_batch_items must be >= 1, not {max_batch_items}")
        self._decode = decode
        self._key = key
        self.max_batch_items = max_batch_items
        self.max_wait_s = max(0.0, max_wait_s)
        self._waiting: deque[_Request[Item, Result, Setting]] = deque()  # oldest first
        self._lock = threading.Condition()
        self._closed = False
        self._requests = self._batches = self._items = self._largest = 0
        self._worker = threading.Thread(target=self._run, name=name, daemon=True)
        self._worker.start()

    def submit(self, items: Sequence[Item], setting: Setting) -> Future[list[Result]]:
        """A future of `items`' results, in their order; raises BatcherClosed after close()."""
        future: Future[list[Result]] = Future()
        with self._lock:
            if self._closed:
                raise BatcherClosed("the batcher is closed")
            self._requests += 1
            if not items:
                future.set_result([])
                return future
            self._waiting.append(_Request(list(items), setting, self._key(setting), future, time.monotonic()))
            self._lock.notify_all()
        return future

    def stats(self) -> BatcherStats:
        with self._lock:
            waiting = sum(len(request.items) - request.taken for request in self._waiting)
            return BatcherStats(self._requests, self._batches, self._items, waiting, self._largest)

    def close(self, timeout: float | None = None) -> bool:
        """Stop accepting, decode everything queued, end the worker; False if it is still
        decoding after `timeout` seconds."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._worker.join(timeout)
        return not self._worker.is_alive()

    # ------------------------------------------------------------------ the worker
    def _run(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            if batch[0]:  # empty when every request of it was cancelled meanwhile
                self._decode_batch(*batch)

    def _next_batch(self) -> tuple[list[tuple[_Request[Item, Result, Setting], int, int]], Any] | None:
        """The next batch as (request, start, end) slices and their setting; None once closed
        and drained. Waits, holding no lock while asleep, for items or for the oldest's deadline."""
        with self._lock:
            while True:
                self._drop_cancelled()
                if not self._waiting:
                    if self._closed:
                        return None
                    self._lock.wait()
                    continue
                oldest = self._waiting[0]
                ready = sum(len(r.items) - r.taken for r in self._waiting if r.key == oldest.key)
                left = oldest.arrived + self.max_wait_s - time.monotonic()
                if ready >= self.max_batch_items or left <= 0 or self._closed:
                    return self._take(oldest.key), oldest.setting
                self._lock.wait(left)

    def _drop_cancelled(self) -> None:
        kept = [request for request in self._waiting if not request.future.cancelled()]
        if len(kept) != len(self._waiting):
            self._waiting = deque(kept)

    def _take(self, key: Hashable) -> list[tuple[_Request[Item, Result, Setting], int, int]]:
        """Up to max_batch_items items of the requests with `key`, oldest first (lock held)."""
        slices, room = [], self.max_batch_items
        for request in list(self._waiting):
            if room == 0:
                break
            if request.key != key or request.future.cancelled():
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
        try:
            results = self._decode(items, setting)
            if len(results) != len(items):
                raise RuntimeError(f"decode returned {len(results)} results for {len(items)} items")
        except Exception as error:  # handed to the request(s) at fault; the worker goes on
            if len(slices) == 1:
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
