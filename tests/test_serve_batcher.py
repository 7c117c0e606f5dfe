"""mtrain.serve.batcher: concurrent requests into few batches, each request's results in order."""

from __future__ import annotations

import threading
import time
from concurrent.futures import CancelledError

import pytest

from mtrain.serve.batcher import Batcher, BatcherClosed


class Recorder:
    """A decode function that records its batches: (setting, items); result = item * 10 + setting."""

    def __init__(self, hold: threading.Event | None = None) -> None:
        self.batches: list[tuple[int, list[int]]] = []
        self.hold = hold
        self.started = threading.Event()

    def __call__(self, items: list[int], setting: int, stop=None) -> list[int]:
        self.started.set()
        if self.hold is not None:
            assert self.hold.wait(10)
        self.batches.append((setting, list(items)))
        return [item * 10 + setting for item in items]


def test_concurrent_requests_share_batches_and_get_their_own_results_in_order():
    decode = Recorder()
    batcher = Batcher(decode, max_batch_items=8, max_wait_s=0.2)
    futures, barrier = {}, threading.Barrier(12)

    def client(number: int) -> None:
        barrier.wait()
        futures[number] = batcher.submit([number * 100, number * 100 + 1], 0)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for number, future in futures.items():
        assert future.result(timeout=10) == [number * 1000, number * 1000 + 10]
    batcher.close()
    stats = batcher.stats()
    assert stats.requests == 12 and stats.items == 24
    assert stats.batches == len(decode.batches) == 3  # 24 items, 8 a batch: 12 requests in 3 batches
    assert max(len(items) for _, items in decode.batches) == stats.largest_batch == 8


def test_settings_never_share_a_batch_and_the_oldest_setting_goes_first():
    hold = threading.Event()
    decode = Recorder(hold)
    batcher = Batcher(decode, max_batch_items=100, max_wait_s=0.0)
    first = batcher.submit([1], 5)  # the worker takes it at once and waits on `hold`
    assert decode.started.wait(5)
    waiting = [batcher.submit([2], 1), batcher.submit([3], 2), batcher.submit([4], 1), batcher.submit([5], 2)]
    hold.set()
    assert first.result(10) == [15]
    assert [future.result(10) for future in waiting] == [[21], [32], [41], [52]]
    assert decode.batches == [(5, [1]), (1, [2, 4]), (2, [3, 5])]


def test_a_request_larger_than_a_batch_is_split_and_put_back_together():
    decode = Recorder()
    batcher = Batcher(decode, max_batch_items=4, max_wait_s=0.0)
    assert batcher.submit(list(range(10)), 0).result(10) == [i * 10 for i in range(10)]
    assert [len(items) for _, items in decode.batches] == [4, 4, 2]
    assert batcher.submit([], 0).result(1) == []  # nothing to decode: answered at once


def test_a_full_batch_goes_at_once_and_a_lone_request_waits_at_most_max_wait():
    decode = Recorder()
    batcher = Batcher(decode, max_batch_items=3, max_wait_s=30.0)
    start = time.monotonic()
    assert batcher.submit([1, 2, 3], 0).result(10) == [10, 20, 30]
    assert time.monotonic() - start < 5  # did not wait the 30 s
    quick = Batcher(Recorder(), max_batch_items=64, max_wait_s=0.05)
    start = time.monotonic()
    assert quick.submit([7], 1).result(10) == [71]
    assert 0.04 < time.monotonic() - start < 5


def test_a_cancelled_request_is_never_decoded():
    hold = threading.Event()
    decode = Recorder(hold)
    batcher = Batcher(decode, max_batch_items=10, max_wait_s=0.0)
    busy = batcher.submit([1], 0)
    assert decode.started.wait(5)
    gone = batcher.submit([2, 3], 0)
    assert gone.cancel()
    kept = batcher.submit([4], 0)
    hold.set()
    assert busy.result(10) == [10] and kept.result(10) == [40]
    with pytest.raises(CancelledError):
        gone.result(0)
    assert [items for _, items in decode.batches] == [[1], [4]]


def test_a_failing_batch_fails_its_requests_and_the_worker_goes_on():
    def decode(items: list[int], setting: int, stop) -> list[int]:
        if 13 in items:
            raise ValueError("unlucky batch")
        return items

    batcher = Batcher(decode, max_batch_items=10, max_wait_s=0.0)
    with pytest.raises(ValueError, match="unlucky"):
        batcher.submit([13], 0).result(10)
    assert batcher.submit([1, 2], 0).result(10) == [1, 2]
    wrong_count = Batcher(lambda items, setting, stop: items[:1], max_batch_items=10, max_wait_s=0.0)
    with pytest.raises(RuntimeError, match="1 results for 2 items"):
        wrong_count.submit([1, 2], 0).result(10)


def test_an_item_that_fails_a_shared_batch_fails_its_own_request_only():
    calls: list[list[int]] = []

    def decode(items: list[int], setting: int, stop) -> list[int]:
        calls.append(list(items))
        if 13 in items:
            raise ValueError("unlucky item")
        return [item * 10 for item in items]

    batcher = Batcher(decode, max_batch_items=10, max_wait_s=0.5)
    before, unlucky, after = batcher.submit([1, 2], 0), batcher.submit([3, 13], 0), batcher.submit([4], 0)
    assert before.result(10) == [10, 20] and after.result(10) == [40]
    with pytest.raises(ValueError, match="unlucky"):
        unlucky.result(10)
    assert calls == [[1, 2, 3, 13, 4], [1, 2], [3, 13], [4]]  # together, then each request alone, once
    assert (batcher.stats().batches, batcher.stats().items) == (2, 3)
    batcher.close()


def test_close_decodes_what_is_queued_without_waiting_then_refuses():
    decode = Recorder()
    batcher = Batcher(decode, max_batch_items=100, max_wait_s=60.0)
    futures = [batcher.submit([n], n % 2) for n in range(5)]
    start = time.monotonic()
    assert batcher.close(timeout=10)
    assert time.monotonic() - start < 5  # the 60 s wait was cut short
    assert [future.result(0) for future in futures] == [[n * 10 + n % 2] for n in range(5)]
    with pytest.raises(BatcherClosed):
        batcher.submit([1], 0)


def test_settings_with_one_key_share_a_batch_decoded_with_the_oldest_ones():
    decode = Recorder()
    batcher = Batcher(decode, max_batch_items=10, max_wait_s=0.1, key=lambda setting: setting % 2)
    futures = [batcher.submit([n], n) for n in (1, 3, 2)]
    assert [future.result(10) for future in futures] == [[11], [31], [22]]  # 3 went with 1, as setting 1
    assert decode.batches == [(1, [1, 3]), (2, [2])]


def test_a_slow_lane_never_holds_up_another_lane():
    """Issue 58: one constrained search held every client of the server for minutes."""
    hold = threading.Event()
    slow, quick = Recorder(hold), Recorder()
    batcher = Batcher(
        lambda items, setting, stop: (slow if setting == 1 else quick)(items, setting),
        max_batch_items=10,
        max_wait_s=0.0,
        lanes=2,
    )
    held = batcher.submit([1], 1, lane=1)
    assert slow.started.wait(5)
    started = time.monotonic()
    assert batcher.submit([2], 0, lane=0).result(timeout=5) == [20]  # while lane 1 is busy
    assert time.monotonic() - started < 2
    hold.set()
    assert held.result(timeout=5) == [11]
    with pytest.raises(ValueError, match="lane 2 is not one of this batcher's 2"):
        batcher.submit([3], 0, lane=2)
    assert batcher.close(timeout=5)
    assert batcher.stats().batches == 2


def test_a_batch_whose_requests_are_all_cancelled_is_told_to_stop_and_is_not_decoded_again():
    calls: list[list[int]] = []
    stopped = threading.Event()

    def decode(items: list[int], setting: int, stop) -> list[int]:
        calls.append(list(items))
        deadline = time.monotonic() + 10
        while not stop():  # a decode that asks at every step, as the server's generator does
            assert time.monotonic() < deadline, "stop() never turned True"
            time.sleep(0.01)
        stopped.set()
        raise RuntimeError("stopped")

    batcher = Batcher(decode, max_batch_items=10, max_wait_s=0.05)
    first, second = batcher.submit([1], 0), batcher.submit([2], 0)  # one batch
    time.sleep(0.2)
    assert calls == [[1, 2]] and not stopped.is_set()
    assert first.cancel()
    time.sleep(0.1)
    assert not stopped.is_set()  # the second request still waits for it
    assert second.cancel()
    assert stopped.wait(5)
    assert batcher.close(timeout=5)
    assert calls == [[1, 2]]  # not decoded again request by request: nobody waits for them
