"""The local MME's HTTP gateway against clients that misbehave: bodies that stall or do not decode, headers Triton's
front-end cannot take, a target that holds its calls; and its metrics past a million.

Why a stand-in for Triton here: what is tested is the gateway's own handling (its timeouts, refusals and its
scheduling of calls across targets), which needs a target whose calls stay in flight until the test releases them;
`FakeTriton` (tests/test_mme_manager.py) answers as Triton's SageMaker front-end does. The gateway, its aiohttp
server and the clients are real, over loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
from aiohttp import web

from tests.test_mme_manager import FakeStore, FakeTriton
from tritonpack.mme.gateway import (
    HELD_BODIES,
    HELD_PER_TARGET,
    INVOKE_THREADS,
    LOADED_THREADS,
    MAX_CALLS_PER_TARGET,
    RESERVED_THREADS,
    Gateway,
)
from tritonpack.mme.health import FaultPolicy
from tritonpack.mme.manager import ModelManager
from tritonpack.mme.metrics import Metrics, parse_metrics

BODY = json.dumps({"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["hi"]}]}).encode()


class HeldTriton(FakeTriton):
    """Calls of targets named `held…` stay in flight until `release` is set, and so do loads of `slow-load…`."""

    def __init__(self):
        super().__init__(8, 0)
        self.release, self.held_calls, self.loads = threading.Event(), 0, 0

    def invoke(self, model_hash, target, body, content_type):
        if target.startswith("held"):
            with self.lock:
                self.held_calls += 1
            self.release.wait(60)
        return super().invoke(model_hash, target, body, content_type)

    def load(self, model_hash, target, url):
        with self.lock:
            self.loads += 1
        if target.startswith("slow-load"):
            self.release.wait(60)
        return super().load(model_hash, target, url)


@pytest.fixture
def gateway():
    yield from serving()


@pytest.fixture
def quick_gateway():
    """A gateway that answers every invocation within one second."""
    yield from serving(invocation_s=1.0)


def serving(max_models: int = 8, **options):
    triton = HeldTriton()
    store = FakeStore()
    store.cache = SimpleNamespace(total_bytes=0, entries={})
    gateway = Gateway(ModelManager(store, triton, max_models, Metrics(), FaultPolicy()), body_read_s=1.0,
                      idle_connection_s=1.0, **options)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def listen() -> tuple[web.AppRunner, int]:
        runner = gateway.runner()
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return runner, runner.addresses[0][1]

    runner, port = asyncio.run_coroutine_threadsafe(listen(), loop).result()
    yield SimpleNamespace(gateway=gateway, triton=triton, port=port)
    triton.release.set()
    asyncio.run_coroutine_threadsafe(gateway.drain(runner, 5.0), loop).result()
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()


def invoke(port: int, target: str, body: bytes = BODY, headers: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/endpoints/local/invocations", data=body,
                                     headers={"X-Amzn-SageMaker-Target-Model": target,
                                              "Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def raw_exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
        client.sendall(data)
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
        return answer


def counts(gateway: Gateway) -> tuple[int, int, int]:
    values = parse_metrics(gateway.metrics.render())
    return tuple(int(values[n]) for n in ("Invocations", "Invocation4XXErrors", "Invocation5XXErrors"))


def test_gateway_answers_other_targets_while_one_target_holds_as_many_calls_as_there_are_threads(gateway):
    """Every invocation thread was free to one target: 64 calls of a slow one made every other target wait."""
    with ThreadPoolExecutor(64) as clients:
        held = [clients.submit(invoke, gateway.port, "held") for _ in range(64)]
        deadline = time.monotonic() + 30
        while gateway.triton.held_calls < MAX_CALLS_PER_TARGET and time.monotonic() < deadline:
            time.sleep(0.05)
        assert invoke(gateway.port, "m0")[0] == 200
        assert gateway.triton.held_calls == MAX_CALLS_PER_TARGET and not any(call.done() for call in held)
        gateway.triton.release.set()
        assert [call.result()[0] for call in held] == [200] * 64


def test_gateway_answers_a_target_while_four_slow_targets_hold_every_call_they_may(gateway):
    """Four slow targets, 16 calls each, held all 64 invocation threads: every other target waited for them."""
    busy_share = INVOKE_THREADS - RESERVED_THREADS
    with ThreadPoolExecutor(4 * MAX_CALLS_PER_TARGET) as clients:
        held = [clients.submit(invoke, gateway.port, f"held{i}") for i in range(4) for _ in range(MAX_CALLS_PER_TARGET)]
        deadline = time.monotonic() + 30
        while gateway.triton.held_calls < busy_share and time.monotonic() < deadline:
            time.sleep(0.05)
        started = time.monotonic()
        assert invoke(gateway.port, "m0")[0] == 200 and time.monotonic() - started < 5
        # the busy targets share what the reserve leaves, and a first call of each may take a reserved thread
        assert busy_share <= gateway.triton.held_calls <= busy_share + 3 and not any(call.done() for call in held)
        gateway.triton.release.set()
        assert [call.result()[0] for call in held] == [200] * len(held)


def wait_until(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)


def test_gateway_answers_a_loaded_target_at_once_while_first_calls_of_many_targets_wait_for_their_loads():
    """First calls of targets not loaded (downloading, checking, loading, waiting for a slot) took every thread: a
    loaded, idle target was answered 424 ModelError at the invocation limit."""
    served = serving(max_models=2 * INVOKE_THREADS, invocation_s=3.0)
    g = next(served)
    assert invoke(g.port, "m0")[0] == 200
    with ThreadPoolExecutor(INVOKE_THREADS) as clients:
        cold = [clients.submit(invoke, g.port, f"slow-load{i}") for i in range(INVOKE_THREADS)]
        cold_share = INVOKE_THREADS - LOADED_THREADS
        wait_until(lambda: g.triton.loads >= 1 + cold_share)
        started = time.monotonic()
        assert invoke(g.port, "m0") == (200, {"model_name": "m0"}) and time.monotonic() - started < 2
        assert g.triton.loads == 1 + cold_share  # the others wait for a thread, holding none
        g.triton.release.set()
        assert {call.result()[0] for call in cold} <= {200, 429}  # 429 ModelNotReady past the limit
    next(served, None)


def test_gateway_answers_429_throttling_without_reading_the_body_when_a_target_has_as_many_requests_as_it_may(
        gateway):
    """Every request waited for a thread with its body read (up to 6 MB each), however many there were: 120 of them
    to a held target took 900 MB."""
    with ThreadPoolExecutor(HELD_PER_TARGET) as clients:
        held = [clients.submit(invoke, gateway.port, "held") for _ in range(HELD_PER_TARGET)]
        wait_until(lambda: gateway.triton.held_calls == MAX_CALLS_PER_TARGET)
        wait_until(lambda: gateway.gateway.held.get("held") == HELD_PER_TARGET)
        head = (b"POST /endpoints/local/invocations HTTP/1.1\r\nHost: x\r\nX-Amzn-SageMaker-Target-Model: held\r\n"
                b"Content-Type: application/json\r\nContent-Length: 6000000\r\n\r\n")
        answer = raw_exchange(gateway.port, head)  # the body is never sent: answered and closed without it
        assert answer.startswith(b"HTTP/1.1 429 ") and b"\r\nRetry-After: 1\r\n" in answer, answer
        error = json.loads(answer.partition(b"\r\n\r\n")[2])
        assert error["ErrorCode"] == "ThrottlingException" and f"{HELD_PER_TARGET} invocations of 'held'" in \
            error["message"]
        assert invoke(gateway.port, "m0")[0] == 200  # other targets are answered
        gateway.triton.release.set()
        assert [call.result()[0] for call in held] == [200] * HELD_PER_TARGET


def test_gateway_answers_429_throttling_when_the_bodies_it_holds_reach_its_byte_bound():
    """The bound on what all targets together hold: bodies counted by their Content-Length before they are read."""
    served = serving(max_payload_bytes=len(BODY))
    g = next(served)
    with ThreadPoolExecutor(HELD_BODIES) as clients:
        held = [clients.submit(invoke, g.port, f"held{i % 4}") for i in range(HELD_BODIES)]
        wait_until(lambda: g.triton.held_calls == HELD_BODIES)
        status, error = invoke(g.port, "m0")
        assert status == 429 and error["ErrorCode"] == "ThrottlingException", error
        assert "MB of request bodies, its bound" in error["message"], error
        g.triton.release.set()
        assert [call.result()[0] for call in held] == [200] * HELD_BODIES
    assert invoke(g.port, "m0")[0] == 200
    next(served, None)


def test_gateway_logs_one_info_line_when_a_client_disconnects_mid_body(gateway, caplog):
    """aiohttp logged an ERROR with a 25-line traceback for each client that went away while sending its body."""
    caplog.set_level(logging.INFO)
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=30) as client:
        client.sendall(b"POST /endpoints/local/invocations HTTP/1.1\r\nHost: x\r\nX-Amzn-SageMaker-Target-Model: "
                       b"m0\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n" + BODY[:10])
        time.sleep(0.2)
    wait_until(lambda: any("closed its connection" in r.getMessage() for r in caplog.records), 5.0)
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said == [("INFO", "the client of an invocation of 'm0' closed its connection before sending the whole "
                              "body")], said
    assert invoke(gateway.port, "m0")[0] == 200


def test_gateway_answers_424_when_a_loaded_target_does_not_answer_within_the_invocation_limit(quick_gateway):
    """SageMaker answers an invocation within 60 s (here 1 s); the gateway waited for a slow model as long as it
    took, and a hung one held its caller for the container's 600 s."""
    started = time.monotonic()
    status, error = invoke(quick_gateway.port, "held0")
    assert (status, error["ErrorCode"]) == (424, "ModelError") and time.monotonic() - started < 3, error
    assert error["message"] == ("Received server error (0) from model 'held0' with message \"no answer within 1 s, "
                                "SageMaker's limit on an invocation\""), error
    quick_gateway.triton.release.set()
    assert invoke(quick_gateway.port, "held0")[0] == 200
    assert counts(quick_gateway.gateway) == (2, 1, 0)


def test_gateway_answers_429_model_not_ready_while_a_load_outlasts_the_limit_and_lets_the_load_finish(quick_gateway):
    """As SageMaker does for a target whose load outlasts an invocation: ModelNotReadyException, and the load goes
    on, so that a later call finds the target loaded."""
    status, error = invoke(quick_gateway.port, "slow-load")
    assert (status, error["ErrorCode"]) == (429, "ModelNotReadyException"), error
    assert "'slow-load' is not loaded yet after 1 s; its load goes on" in error["message"]
    assert "slow-load" not in quick_gateway.gateway.manager.loaded_targets()
    quick_gateway.triton.release.set()
    deadline = time.monotonic() + 10
    while "slow-load" not in quick_gateway.gateway.manager.loaded_targets() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert invoke(quick_gateway.port, "slow-load")[0] == 200 and quick_gateway.triton.loads == 1


def test_gateway_answers_400_when_the_content_type_is_not_ascii(gateway):
    """http.client encodes headers as Latin-1: a UTF-8 Content-Type was a 500 naming UnicodeEncodeError."""
    head = (b"POST /endpoints/local/invocations HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"X-Amzn-SageMaker-Target-Model: m0\r\nContent-Type: application/json; x=\xe6\x9d\xb1\r\n")
    answer = raw_exchange(gateway.port, head + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY)
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["message"] == "Content-Type must be ASCII"
    assert counts(gateway.gateway) == (1, 1, 0)


@pytest.mark.parametrize("encoding", [b"gzip", b"deflate", b"br"])
def test_gateway_answers_400_when_the_body_does_not_decode_as_its_content_encoding_says(gateway, encoding, caplog):
    """aiohttp's own plain-text 500, uncounted, with two tracebacks in the log, before; then the 400, with aiohttp's
    traceback of the same body still in the log."""
    caplog.set_level(logging.INFO)
    head = (b"POST /endpoints/local/invocations HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"X-Amzn-SageMaker-Target-Model: m0\r\nContent-Type: application/json\r\nContent-Encoding: " + encoding)
    answer = raw_exchange(gateway.port, head + b"\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY)
    assert answer.startswith(b"HTTP/1.1 400 ")
    message = json.loads(answer.partition(b"\r\n\r\n")[2])["message"]
    assert message == f"the request body does not decode: Can not decode content-encoding: {encoding.decode()}"
    assert counts(gateway.gateway) == (1, 1, 0)
    compressed = gzip.compress(BODY)
    assert invoke(gateway.port, "m0", compressed, {"Content-Encoding": "gzip"})[0] == 200
    logged = [record for record in caplog.records if record.name.startswith("aiohttp")]
    assert not any(record.exc_info for record in logged), [record.getMessage() for record in logged]


def test_gateway_answers_400_when_a_request_repeats_a_key_triton_would_read_otherwise(gateway):
    """The guard kept the last `shape` and Triton the first: 200 for a shape that wraps at 2**32, and tritonserver
    reserving memory for a shape the data never filled."""
    body = (b'{"inputs": [{"name": "TEXT", "shape": [4294967297, 1], "shape": [1, 1], "datatype": "BYTES", '
            b'"data": ["x"]}]}')
    status, answer = invoke(gateway.port, "m0", body)
    assert (status, answer["message"]) == (400, "request header repeats the key 'shape' in one object")


def test_gateway_answers_413_at_once_to_a_client_that_asks_before_sending_a_body_above_the_limit(gateway):
    """It answered 100 Continue, inviting the 7 MB, and only then 413."""
    head = (b"POST /endpoints/local/invocations HTTP/1.1\r\nHost: x\r\nX-Amzn-SageMaker-Target-Model: m0\r\n"
            b"Content-Type: application/json\r\nExpect: 100-continue\r\n")
    answer = raw_exchange(gateway.port, head + b"Content-Length: 7000000\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 413 ") and b"100 Continue" not in answer, answer[:200]
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=30) as client:  # within the limit: invited
        client.sendall(head + b"Content-Length: %d\r\n\r\n" % len(BODY))
        assert client.recv(65536).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        client.sendall(BODY)
        assert client.recv(65536).startswith(b"HTTP/1.1 200 ")


def test_gateway_logs_a_malformed_request_in_one_short_line(gateway, caplog):
    """A chunked body of 1 MB with no chunk size line put ~128 kB of the client's bytes into each log line."""
    caplog.set_level(logging.INFO)
    with contextlib.suppress(ConnectionResetError, BrokenPipeError):  # it closes once it has read enough to refuse
        raw_exchange(gateway.port, b"POST /endpoints/local/invocations HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
                                   b"chunked\r\n\r\n" + b"z" * (1 << 20))
    wait_until(lambda: any(r.name.startswith("aiohttp") for r in caplog.records), 5.0)
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("aiohttp")]
    assert lines and all(len(line) < 1000 and "\n" not in line for line in lines), [len(line) for line in lines]


def test_gateway_answers_408_and_closes_when_a_body_stops_arriving(gateway):
    """A body one byte short held its connection and up to 6 MB for as long as the client liked."""
    head = (b"POST /endpoints/local/invocations HTTP/1.1\r\nHost: x\r\n"
            b"X-Amzn-SageMaker-Target-Model: m0\r\nContent-Type: application/json\r\n")
    answer = raw_exchange(gateway.port, head + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY[:-1])
    assert answer.startswith(b"HTTP/1.1 408 ")  # and the connection closed: raw_exchange read to its end
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["message"] == ("the request body did not arrive within "
                                                                      "1 s")
    assert counts(gateway.gateway) == (1, 1, 0)


@pytest.mark.parametrize("sent", [b"", b"POST /endpoints/local/invocations HTTP/1.1\r\nHost: x\r\n"])
def test_gateway_closes_a_connection_that_sends_no_whole_request_after_its_idle_limit(gateway, sent):
    """aiohttp's default kept it for an hour: a client could hold descriptors until the gateway ran out."""
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=30) as client:
        client.sendall(sent)
        start = time.monotonic()
        assert client.recv(65536) == b""  # closed, without an answer
        assert time.monotonic() - start < 10


def test_metrics_render_every_digit_of_a_count_above_a_million():
    metrics = Metrics()
    for _ in range(3):
        metrics.inc("Invocations", 411_522)
    values = parse_metrics(metrics.render())
    assert values["Invocations"] == 1_234_566  # ':g' rendered 1.23457e+06


@pytest.mark.parametrize("target", ["./a.tar.gz", "m//a.tar.gz", " a.tar.gz", "a\u0085.tar.gz", "a\tb.tar.gz",
                                    "../a.tar.gz", "/a.tar.gz", "m/"])
def test_target_names_follow_sagemakers_pattern_and_name_one_key(target):
    """TargetModel is \\A\\S[\\p{Print}]*\\z, and S3 does not normalise keys: "./a.tar.gz" loaded a second copy of
    a.tar.gz here, counted against --max-models, where SageMaker finds no such key."""
    from tritonpack.mme.sources import TargetError, validate_target

    with pytest.raises(TargetError) as refused:
        validate_target(target)
    assert refused.value.status == 400
    assert validate_target("models/a b.tar.gz") == "models/a b.tar.gz"
