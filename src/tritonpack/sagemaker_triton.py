"""The bundled tritonserver started as the SageMaker Triton container starts it in MME mode, and its contract.

Flags mirror `docker/sagemaker/serve` (triton-inference-server/server) with SAGEMAKER_MULTI_MODEL=true: explicit
model control, model namespacing, only the SageMaker front-end listening (no HTTP/gRPC/metrics), ping mode
`live`, python backend shared memory 16 MB / 1 MB. The contract is the one SageMaker's model server speaks to
the container (`src/sagemaker_server.cc`): `POST /models {"model_name": <hash>, "url": <folder>}` with the
target name in `X-Amzn-SageMaker-Target-Model` (it becomes the Triton model name), `POST /models/<hash>/invoke`,
`DELETE /models/<hash>`, `GET /ping`.
"""

from __future__ import annotations

import http.client
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tritonpack.errors import TritonpackError
from tritonpack.server import ServerError, TritonServer, free_port

TARGET_HEADER = "X-Amzn-SageMaker-Target-Model"
SHM_DEFAULT_BYTES = 16 * 1024 * 1024
SHM_GROWTH_BYTES = 1024 * 1024


class TritonUnavailable(TritonpackError, ConnectionError):
    """The SageMaker front-end did not answer (the server is down or dying)."""


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes = b""
    content_type: str = "application/json"

    @property
    def message(self) -> str:
        from tritonpack.codec import error_message

        return error_message(self.body) if self.body else f"HTTP {self.status}"


def sagemaker_args(port: int, dummy_repository: Path, extra: list[str] | tuple[str, ...] = ()) -> list[str]:
    return [
        f"--model-repository={dummy_repository}",
        "--allow-sagemaker=true",
        f"--sagemaker-port={port}",
        "--allow-http=false",
        "--allow-grpc=false",
        "--allow-metrics=false",
        "--model-control-mode=explicit",
        "--model-namespacing=true",
        f"--backend-config=python,shm-default-byte-size={SHM_DEFAULT_BYTES}",
        f"--backend-config=python,shm-growth-byte-size={SHM_GROWTH_BYTES}",
        *extra,
    ]


@dataclass
class SageMakerTriton:
    """A tritonserver with only its SageMaker front-end on 127.0.0.1:`port`."""

    port: int = 0
    log_path: Path | None = None
    extra_args: list[str] = field(default_factory=list)
    timeout_s: float = 600.0
    server: TritonServer | None = None
    starts: int = 0

    def __post_init__(self) -> None:
        self.port = self.port or free_port()
        self._workdir = Path(tempfile.mkdtemp(prefix="tritonpack-mme-"))
        self.log_path = Path(self.log_path or self._workdir / "tritonserver.log")

    def start(self, timeout_s: float = 180.0) -> SageMakerTriton:
        # The serve script points --model-repository at an empty dummy folder: each target is its own repository.
        dummy = self._workdir / "sagemaker"
        dummy.mkdir(exist_ok=True)
        self.server = TritonServer(
            None, log_path=self.log_path, extra_args=sagemaker_args(self.port, dummy, self.extra_args),
            env={"SAGEMAKER_MULTI_MODEL": "true", "SAGEMAKER_TRITON_PING_MODE": "live"},
        )
        self.server.start(wait_ready=False)
        self.starts += 1
        import time

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise ServerError(f"tritonserver exited with {self.exit_code()} at start-up; log: {self.log_path}\n"
                                  f"{self.server.log_tail()}")
            if self.ping():
                return self
            time.sleep(0.2)
        self.stop()
        raise ServerError(f"tritonserver's SageMaker port {self.port} did not answer /ping within {timeout_s:.0f}s; "
                          f"log: {self.log_path}")

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM, up to `timeout_s` for Triton to unload its models and exit, then the process group is killed."""
        if self.server is not None:
            self.server.stop(timeout_s)

    def restart(self, stop_timeout_s: float = 30.0) -> SageMakerTriton:
        self.stop(stop_timeout_s)
        return self.start()

    def alive(self) -> bool:
        return self.server is not None and self.server.process is not None and self.server.process.poll() is None

    def exit_code(self) -> int | None:
        return None if self.server is None or self.server.process is None else self.server.process.poll()

    def log_tail(self, lines: int = 10) -> str:
        return self.server.log_tail(lines) if self.server is not None else ""

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
                timeout: float | None = None) -> Reply:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout or self.timeout_s)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            return Reply(response.status, response.read(), response.getheader("Content-Type", "application/json"))
        except (ConnectionError, http.client.HTTPException, OSError) as e:
            raise TritonUnavailable(f"tritonserver's SageMaker port {self.port}: {e}") from e
        finally:
            conn.close()

    def ping(self) -> bool:
        try:
            return self.request("GET", "/ping", timeout=2).status == 200
        except TritonUnavailable:
            return False

    def load(self, model_hash: str, target: str, url: Path) -> Reply:
        body = json.dumps({"model_name": model_hash, "url": str(url)}).encode()
        return self.request("POST", "/models", body, {TARGET_HEADER: target, "Content-Type": "application/json"})

    def unload(self, model_hash: str, target: str, timeout: float | None = None) -> Reply:
        return self.request("DELETE", f"/models/{model_hash}", headers={TARGET_HEADER: target}, timeout=timeout)

    def invoke(self, model_hash: str, target: str, body: bytes, content_type: str | None) -> Reply:
        headers = {TARGET_HEADER: target, "Content-Type": content_type or "application/json"}
        return self.request("POST", f"/models/{model_hash}/invoke", body, headers)

    def __enter__(self) -> SageMakerTriton:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
