"""A framework runner that reads `TEXT` itself: the tokenizer's step and the encoder's in one process.

Triton's python backend fails every request of a dynamic batch when one of them carries malformed BYTES framing
(README, "Reliability"), so the step that reads client bytes runs without Triton's batcher: `execute` gets one
request at a time. It decodes and tokenizes that request, queues it with its response sender and returns None (a
model that is not decoupled may answer later through the sender, once); one thread takes everything queued, runs
the encoder on it as one batch and answers each request. Requests are thus batched here instead of by Triton, and a
text costs one python process and one hop fewer than a tokenizer step in front of the encoder (portable `bert`'s
default, `encoder_tokenizes`). The price: if this stub dies, Triton 2.51 never answers the requests it had queued; the
local MME restarts Triton for them (`ModelManager.charge_stranded_targets`; docs/performance.md, fifty-eighth round).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable

from batched_requests import ClientError, error_response, internal_error, respond_all
from tokenize_text import TextInput, TextTokenizer


class Closed(RuntimeError):
    """The queue takes no more items: the model is unloading."""


class RequestQueue:
    """Items queued one request at a time, answered in batches by one thread of its own.

    `answer(items)` returns one response per item (a failing item answers for itself: `respond_all`); `send(sender,
    response)` delivers one. A batch takes everything queued, in arrival order, up to `max_rows` rows (a larger
    item goes alone) and, with `max_items`, that many items. `close` answers what is queued, then stops the thread."""

    def __init__(self, answer: Callable[[list], list], send: Callable[[object, object], None], max_rows: int, *,
                 max_items: int = 0, on_error: Callable[[str], None]):
        self._answer, self._send, self._on_error = answer, send, on_error
        self._max_rows, self._max_items = max_rows, max_items
        self._queue: deque[tuple[object, int, object]] = deque()
        self._ready = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="request-batches", daemon=True)
        self._thread.start()

    def put(self, item, rows: int, sender) -> None:
        with self._ready:
            if self._closed:
                raise Closed("the model is unloading")
            self._queue.append((item, rows, sender))
            self._ready.notify()

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify()
        self._thread.join()

    def _next_batch(self) -> list[tuple[object, int, object]]:
        """What is queued, within the budgets; empty once closed and drained."""
        with self._ready:
            self._ready.wait_for(lambda: self._queue or self._closed)
            batch, rows = [], 0
            while self._queue and (not batch or self._fits(len(batch), rows + self._queue[0][1])):
                batch.append(self._queue.popleft())
                rows += batch[-1][1]
            return batch

    def _fits(self, items: int, rows: int) -> bool:
        """Whether one more item may join a batch of `items`, which would then hold `rows` rows."""
        return rows <= self._max_rows and not 0 < self._max_items <= items

    def _serve(self) -> None:
        while batch := self._next_batch():
            try:
                responses = self._answer([item for item, _, _ in batch])
            except Exception as e:  # noqa: BLE001 - answer() isolates failing items; this is a bug, not a request's
                self._on_error(f"answering a batch of {len(batch)} failed: {type(e).__name__}: {e}")
                responses = [e] * len(batch)
            for (_, _, sender), response in zip(batch, responses):
                try:
                    self._send(sender, response)
                except Exception as e:  # noqa: BLE001 - one lost client must not stop the others' answers
                    self._on_error(f"sending a response failed: {type(e).__name__}: {e}")


class TextRequests:
    """`execute` for a runner whose config reads TEXT (TYPE_STRING [1], batched) and whose parameters name the
    tokenizer (`tokenizer`: its file in the version folder, `token_inputs`: what the encoder reads, in order,
    `max_sequence_length`, `pad_token`, `max_text_bytes`; `batch_requests` false: each request runs alone).
    `run(items)` embeds a batch of tokenized requests, `to_tensors(outputs)` makes one request's output tensors."""

    def __init__(self, pb_utils, config: dict, params: dict[str, str], tokenizer_path: str, run: Callable,
                 to_tensors: Callable):
        self._pb = pb_utils
        # Each request is tokenized on the stub's thread while the encoder's threads compute on the same cores: the
        # tokenizers library's thread pool would only compete with them, and costs threads and memory (docs/
        # performance.md, fifty-ninth round). A value the deployment set stays.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self._text = TextInput.from_config(config, params)
        self._tokenizer = TextTokenizer.from_parameters(tokenizer_path, params,
                                                        "token_type_ids" in params["token_inputs"].split(","))

        def answer(items: list) -> list:  # the items are parsed already
            return respond_all(pb_utils, items, lambda item: item, run, to_tensors, pb_utils.Logger)

        alone = params.get("batch_requests", "true") == "false"
        self._queue = RequestQueue(answer, self._send, self._text.max_batch, max_items=1 if alone else 0,
                                   on_error=pb_utils.Logger.log_error)

    def execute(self, requests) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                texts = self._text.read(self._pb, request)
                self._queue.put(self._tokenizer.per_request([texts])[0], len(texts), sender)
            except Exception as e:  # noqa: BLE001 - this request's own failure: answered, never raised to the stub
                if not isinstance(e, (ClientError, Closed)):
                    self._pb.Logger.log_error(f"reading a request failed: {type(e).__name__}: {e}")
                self._send(sender, e)

    def close(self) -> None:
        self._queue.close()

    def _send(self, sender, response) -> None:
        """Deliver a response, or an exception as its error: the client's mistake INVALID_ARG, unloading
        UNAVAILABLE, anything else INTERNAL."""
        errors = self._pb.TritonError
        if isinstance(response, ClientError):
            response = error_response(self._pb, str(response), errors.INVALID_ARG)
        elif isinstance(response, Closed):
            response = error_response(self._pb, str(response), errors.UNAVAILABLE)
        elif isinstance(response, Exception):
            self._pb.Logger.log_error(f"answering a request failed: {type(response).__name__}: {response}")
            response = internal_error(self._pb, response)
        sender.send(response, flags=self._pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
