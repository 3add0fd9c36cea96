"""Fault injection on a real tritonserver: a python stub killed under load (own server: it gets broken).

Observed with Triton 2.51 (README, "Reliability"): every request routed through the dead step after it died fails
with 500 "Stub process '<model>_0_0' is not healthy"; the requests portable `bert`'s encoder had queued (it reads the
text and answers through response senders) are never answered; the python backend does not restart the stub, and
`/v2/health/ready` and `/v2/models/<step>/ready` keep answering 200. `TritonServer.dead_stubs()` detects it;
restarting the server recovers, and stop() leaves no process, zombie or /dev/shm region behind.
The local MME's behaviour (it restarts Triton for the unanswered calls) is in tests/test_mme.py.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter

import pytest
import requests

from tests.reliability import hostile
from tritonpack.proc import group_members
from tritonpack.server import TritonServer

VALID = hostile.text_request(["a sentence under fire"])


def send_valid(server: TritonServer, path: str, timeout_s: float, session=None) -> tuple[int, str]:
    """(status, text) of one valid request; (0, the reason) when nothing answers, as after the server aborted."""
    try:
        return hostile.send(server.url, path, VALID, session=session, timeout=timeout_s)
    except requests.RequestException as e:
        return 0, str(e)


class Load:
    """8 threads sending valid requests until stopped; (start time, status, error text) per request."""

    def __init__(self, server: TritonServer, path: str, threads: int = 8, timeout_s: float = 60):
        self.server, self.path, self.results, self.done = server, path, [], threading.Event()
        self.timeout_s = timeout_s
        self.threads = [threading.Thread(target=self._work) for _ in range(threads)]

    def _work(self) -> None:
        with requests.Session() as session:
            while not self.done.is_set():
                start = time.monotonic()
                status, text = send_valid(self.server, self.path, self.timeout_s, session)
                self.results.append((start, status, "" if status == 200 else text[:200]))

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        for thread in self.threads:
            thread.join()


@pytest.mark.server
def test_served_ensemble_fails_requests_through_dead_step_and_stays_ready_when_a_stub_is_killed(build_ensemble):
    # a model with a dead stub never unloads: Triton's exit timeout (30 s by default) always runs out
    server = TritonServer(build_ensemble("bert").repository, extra_args=["--exit-timeout-secs=5"]).start()
    pgid = server.process.pid
    regions = server.stub_shm_regions()
    assert regions, "no /dev/shm region of the server's stubs found: the check after stop() would prove nothing"
    try:
        victim = next(pid for pid, model in server.stub_models().items() if model == "bert_encoder")
        with Load(server, "/v2/models/bert/infer", timeout_s=8) as load:
            time.sleep(2)
            killed_at = time.monotonic()
            os.kill(victim, signal.SIGKILL)  # a stub of the tritonserver this test started
            time.sleep(2)
            # each request queued for the dead stub is failed after ~1 s, one after another
            later = [send_valid(server, "/v2/models/bert/infer", 30) for _ in range(2)]
        before = Counter(status for start, status, _ in load.results if start < killed_at - 0.5)
        unanswered = [status for start, status, _ in load.results if start <= killed_at and status != 200]
        assert set(before) == {200} and sum(before.values()) > 10, before
        if server.process.poll() is not None:
            # Triton's rare abort (`hostile.STUB_LOCK_ABORT`): no answer after it, and stop() still cleans up
            assert hostile.STUB_LOCK_ABORT in server.log_path.read_text()
        else:
            assert all(status == 500 and "is not healthy" in text for status, text in later), later
            # those in the dead stub's `execute` failed; those the encoder had queued (if the kill found any) are
            # never answered by Triton 2.51: the clients' 8 s ran out
            assert set(unanswered) <= {0, 500}, unanswered
            # Triton 2.51 still calls the server and the model ready: only the stub's state tells
            assert server.is_ready()
            assert requests.get(f"http://{server.url}/v2/models/bert_encoder/ready", timeout=5).status_code == 200
            assert server.dead_stubs() == ["bert_encoder"]
    finally:
        server.stop()
    assert group_members(pgid) == [], "processes (or zombies) of the server's group outlived stop()"
    assert not regions & hostile.shm_regions(), "the server's /dev/shm regions outlived stop()"
    assert "bert_encoder" in server.log_path.read_text(), "the log of a server whose stub died is gone"
    with TritonServer(build_ensemble("bert").repository) as fresh:
        assert hostile.send(fresh.url, "/v2/models/bert/infer", VALID)[0] == 200
        assert fresh.dead_stubs() == []


@pytest.mark.server
def test_server_stop_leaves_no_process_or_shm_when_a_client_keeps_a_connection_open(build_ensemble):
    """An idle keep-alive connection makes Triton's exit time out before it unloads models; stop() still cleans.

    (The exit timeout is shortened from Triton's 30 s default to keep the test quick; the behaviour is the same.)
    """
    server = TritonServer(build_ensemble("bert").repository, extra_args=["--exit-timeout-secs=3"]).start()
    pgid, regions = server.process.pid, server.stub_shm_regions()
    session = requests.Session()
    try:
        assert hostile.send(server.url, "/v2/models/bert/infer", VALID, session=session)[0] == 200
        server.stop()
    finally:
        session.close()
        server.stop()
    assert regions and group_members(pgid) == []
    assert not regions & hostile.shm_regions()
