"""The bundled tritonserver started as the SageMaker Triton container starts it in MME mode, and its contract.

Flags mirror `docker/sagemaker/serve` (triton-inference-server/server) with SAGEMAKER_MULTI_MODEL=true: explicit
model control, model namespacing, only the SageMaker front-end listening (no HTTP/gRPC/metrics), ping mode
`live`, and what the container environment sets (`containers.serve_flags`: python backend shared memory, additional
arguments; by default the environment `tritonpack deploy` gives an endpoint). The contract is the one SageMaker's
model server speaks to the container (`src/sagemaker_server.cc`): `POST /models {"model_name": <hash>, "url":
<folder>}` with the target name in `X-Amzn-SageMaker-Target-Model` (it becomes the Triton model name),
`POST /models/<hash>/invoke`, `DELETE /models/<hash>`, `GET /ping`.
"""

from __future__ import annotations

import http.client
import json
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tritonpack.containers import CONTAINER_ENVIRONMENT, ContainerPython, serve_flags
from tritonpack.errors import TritonpackError
from tritonpack.server import ServerMemory, TritonServer, free_port

TARGET_HEADER = "X-Amzn-SageMaker-Target-Model"


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


def sagemaker_args(port: int, dummy_repository: Path, environment: Mapping[str, str]) -> list[str]:
    return [
        f"--model-repository={dummy_repository}",
        "--allow-sagemaker=true",
        f"--sagemaker-port={port}",
        "--allow-http=false",
        "--allow-grpc=false",
        "--allow-metrics=false",
        "--model-control-mode=explicit",
        "--model-namespacing=true",
        *serve_flags(environment),
    ]


class Container(Protocol):
    """What the model manager needs of the container: `SageMakerTriton`, or a stand-in in property tests."""

    starts: int
    log_path: Path | None

    def alive(self) -> bool: ...
    def exit_code(self) -> int | None: ...
    def ping(self) -> bool: ...
    def track_stubs(self) -> None: ...
    def dead_stub_files(self) -> list[Path]: ...
    def memory(self) -> ServerMemory | None: ...
    def load(self, model_hash: str, target: str, url: Path) -> Reply: ...
    def unload(self, model_hash: str, target: str, timeout: float | None = None) -> Reply: ...
    def invoke(self, model_hash: str, target: str, body: bytes, content_type: str | None) -> Reply: ...
    def start(self, timeout_s: float = 180.0) -> Container: ...
    def stop(self, timeout_s: float = 30.0) -> None: ...


@dataclass
class SageMakerTriton:
    """A tritonserver with only its SageMaker front-end on 127.0.0.1:`port`. Its working folder (the dummy
    repository, and the log unless `log_path` names another place) is removed by `close`."""

    port: int = 0
    log_path: Path | None = None
    # the container's, as an endpoint's model sets it
    environment: Mapping[str, str] = field(default_factory=lambda: dict(CONTAINER_ENVIRONMENT))
    timeout_s: float = 600.0
    invoke_timeout_s: float = 600.0  # how long an invocation's thread waits for Triton's answer
    container_python: ContainerPython | None = None  # the stub of the container's Python, as the container runs
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
            None, log_path=self.log_path, extra_args=sagemaker_args(self.port, dummy, self.environment),
            env={"SAGEMAKER_MULTI_MODEL": "true", "SAGEMAKER_TRITON_PING_MODE": "live"}, taken_ports=(self.port,),
            container_python=self.container_python,
        )
        self.server.start(wait_ready=False)
        self.starts += 1
        self.server.wait_ready(timeout_s, probe=self.ping)
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM, up to `timeout_s` for Triton to unload its models and exit, then the process group is killed.
        A model whose python stub died never finishes unloading in Triton 2.51: then 5 s, not the whole wait."""
        if self.server is not None:
            self.server.stop(min(timeout_s, 5.0) if self.alive() and self.server.dead_stubs() else timeout_s)

    def track_stubs(self) -> None:
        """Note the running stubs and their /dev/shm regions, so that `stop` removes them even if they die."""
        if self.server is not None:
            self.server.stub_models()

    def dead_stub_files(self) -> list[Path]:
        """The model.py files of its python stubs that died (`TritonServer.dead_stub_files`)."""
        return self.server.dead_stub_files() if self.server is not None else []

    def memory(self) -> ServerMemory | None:
        return self.server.memory() if self.server is not None else None

    def close(self, timeout_s: float = 30.0, keep_log: bool = False) -> None:
        """Stop the server and remove the working folder (kept with its log when an error names it)."""
        self.stop(timeout_s)
        if not keep_log:
            shutil.rmtree(self._workdir, ignore_errors=True)

    def alive(self) -> bool:
        return self.server is not None and self.server.process is not None and self.server.process.poll() is None

    def exit_code(self) -> int | None:
        return None if self.server is None or self.server.process is None else self.server.process.poll()

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

    # The target goes to Triton as UTF-8 bytes, as SageMaker sends TargetModel (http.client would use latin-1).
    def load(self, model_hash: str, target: str, url: Path) -> Reply:
        body = json.dumps({"model_name": model_hash, "url": str(url)}).encode()
        return self.request("POST", "/models", body, {TARGET_HEADER: target.encode(),
                                                       "Content-Type": "application/json"})

    def unload(self, model_hash: str, target: str, timeout: float | None = None) -> Reply:
        return self.request("DELETE", f"/models/{model_hash}", headers={TARGET_HEADER: target.encode()},
                            timeout=timeout)

    def invoke(self, model_hash: str, target: str, body: bytes, content_type: str | None) -> Reply:
        headers = {TARGET_HEADER: target.encode(), "Content-Type": content_type or "application/json"}
        return self.request("POST", f"/models/{model_hash}/invoke", body, headers, timeout=self.invoke_timeout_s)

    def __enter__(self) -> SageMakerTriton:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
