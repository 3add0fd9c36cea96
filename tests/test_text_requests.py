"""The queue a text-reading runner batches its requests with (models/framework_runner/text_requests.py), alone."""

from __future__ import annotations

import threading

import pytest

from tritonpack.components import load_model_module

RequestQueue = load_model_module("framework_runner", "text_requests").RequestQueue


class Recorder:
    """answer(): records each batch and answers item → item * 10; the first batch waits for `release`."""

    def __init__(self):
        self.batches, self.sent, self.errors = [], {}, []
        self.entered, self.released, self.done = threading.Event(), threading.Event(), threading.Semaphore(0)

    def answer(self, items):
        self.batches.append(list(items))
        self.entered.set()
        assert self.released.wait(30)
        return [item * 10 for item in items]

    def send(self, sender, response):
        self.sent[sender] = response
        self.done.release()

    def wait_sent(self, n):
        for _ in range(n):
            assert self.done.acquire(timeout=30)


def _queue(recorder, **options):
    return RequestQueue(recorder.answer, recorder.send, on_error=recorder.errors.append, **options)


def _hold_first(queue, recorder):
    queue.put(0, 1, "first")
    assert recorder.entered.wait(30)


def test_request_queue_batches_what_queued_while_a_batch_ran_within_max_rows():
    recorder = Recorder()
    queue = _queue(recorder, max_rows=4)
    _hold_first(queue, recorder)
    for i, rows in enumerate([1, 2, 1, 3, 1], start=1):
        queue.put(i, rows, f"s{i}")
    recorder.released.set()
    recorder.wait_sent(6)
    queue.close()
    assert recorder.batches == [[0], [1, 2, 3], [4, 5]]  # 1+2+1 rows, then 3+1: in arrival order, never over 4
    assert recorder.sent == {"first": 0, **{f"s{i}": i * 10 for i in range(1, 6)}}


def test_request_queue_runs_an_item_larger_than_max_rows_alone():
    recorder = Recorder()
    recorder.released.set()
    queue = _queue(recorder, max_rows=4)
    queue.put(1, 9, "big")
    recorder.wait_sent(1)
    queue.close()
    assert recorder.batches == [[1]] and recorder.sent == {"big": 10}


def test_request_queue_runs_each_item_alone_when_max_items_is_one():
    recorder = Recorder()
    queue = _queue(recorder, max_rows=64, max_items=1)
    _hold_first(queue, recorder)
    for i in range(1, 4):
        queue.put(i, 1, i)
    recorder.released.set()
    recorder.wait_sent(4)
    queue.close()
    assert recorder.batches == [[0], [1], [2], [3]]


def test_request_queue_keeps_answering_when_sending_one_response_fails():
    recorder = Recorder()
    recorder.released.set()
    send = recorder.send

    def send_or_fail(sender, response):
        if sender == "gone":
            raise ConnectionError("client gone")
        send(sender, response)

    queue = RequestQueue(recorder.answer, send_or_fail, max_rows=64, on_error=recorder.errors.append)
    queue.put(1, 1, "gone")
    queue.put(2, 1, "here")
    recorder.wait_sent(1)
    queue.close()
    assert recorder.sent == {"here": 20}
    assert recorder.errors == ["sending a response failed: ConnectionError: client gone"]


def test_request_queue_answers_every_item_of_a_batch_with_the_error_when_answering_raises():
    sent = {}

    def broken(items):
        raise ValueError("bug")

    queue = RequestQueue(broken, sent.__setitem__, max_rows=64, on_error=lambda message: None)
    queue.put(1, 1, "a")
    queue.put(2, 1, "b")
    queue.close()
    assert set(sent) == {"a", "b"} and all(isinstance(e, ValueError) for e in sent.values())


def test_request_queue_answers_what_is_queued_then_refuses_new_items_when_closed():
    recorder = Recorder()
    queue = _queue(recorder, max_rows=64)
    _hold_first(queue, recorder)
    queue.put(1, 1, "queued")
    closing = threading.Thread(target=queue.close)
    closing.start()
    recorder.released.set()
    closing.join(30)
    assert recorder.sent == {"first": 0, "queued": 10}
    with pytest.raises(RuntimeError, match="unloading"):  # Closed
        queue.put(2, 1, "late")
