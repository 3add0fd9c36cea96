"""locust users for the local MME load run (tests/reliability/mme_load.py starts locust with this file).

Each user calls the healthy targets in a closed loop, as SageMaker clients on keep-alive connections would, and every
request is appended to the CSV file named by MME_LOAD_LOG: start (Unix time), target, status (0: no answer), seconds,
Retry-After, and the error body or exception. locust runs in its own process: gevent patches the standard library
there, not in the tests.
"""

from __future__ import annotations

import csv
import json
import os

from locust import HttpUser, constant, events, task

BODY = json.dumps({"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": ["load"]}]}).encode()
TARGET_HEADER = "X-Amzn-SageMaker-Target-Model"
_log = open(os.environ["MME_LOAD_LOG"], "a", newline="", buffering=1)  # noqa: SIM115 - open for the whole run
_writer = csv.writer(_log)


@events.request.add_listener
def record(request_type, name, response_time, response_length, response, exception, start_time=None, **_):
    status = getattr(response, "status_code", 0) or 0
    retry_after = response.headers.get("Retry-After", "") if status else ""
    reason = "" if status == 200 else (response.text if status else str(exception))[:160]
    _writer.writerow([f"{start_time:.4f}", name, status, f"{response_time / 1000:.4f}", retry_after, reason])


class SageMakerClient(HttpUser):
    wait_time = constant(0)

    def invoke(self, target: str) -> None:
        with self.client.post("/endpoints/local/invocations", data=BODY, name=target, catch_response=True,
                              headers={TARGET_HEADER: target, "Content-Type": "application/json"}) as response:
            if response.status_code == 200:
                response.success()
            else:
                response.failure(f"HTTP {response.status_code}")

    @task(3)
    def first(self) -> None:
        self.invoke("a.tar.gz")

    @task(3)
    def second(self) -> None:
        self.invoke("b.tar.gz")

    @task(1)
    def third(self) -> None:
        self.invoke("c.tar.gz")
