"""`tritonpack mme` as an object: Triton's SageMaker front-end, the model manager and the gateway on `host:port`,
usable as a context manager (tests, scripts) or from the command line."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from tritonpack.containers import AUTO, CONTAINER_ENVIRONMENT, DEFAULT_CONTAINER, ContainerPython
from tritonpack.errors import ServerError, UserError
from tritonpack.mme.container import SageMakerTriton
from tritonpack.mme.gateway import INVOCATION_S, Gateway
from tritonpack.mme.health import FaultPolicy
from tritonpack.mme.manager import ModelManager
from tritonpack.mme.metrics import Metrics
from tritonpack.mme.request_guard import MAX_PAYLOAD_BYTES
from tritonpack.mme.sources import open_source
from tritonpack.mme.store import DiskCache, TargetStore

log = logging.getLogger("tritonpack.mme")

LISTEN_BACKLOG = 1024
# A call answered at the invocation limit keeps its thread until Triton answers; it stops waiting this much later
ABANDONED_CALL_S = 5.0


@dataclass
class LocalMME:
    models: str
    port: int = 8080
    host: str = "127.0.0.1"
    max_models: int = 8
    cache_dir: Path | None = None
    cache_bytes: int = 20 << 30
    s3_endpoint_url: str | None = None
    max_payload_bytes: int = MAX_PAYLOAD_BYTES
    triton_log: Path | None = None  # kept after stop; by default the log goes with the working folder
    policy: FaultPolicy | None = None
    drain_s: float = 30.0  # how long stop() lets calls in flight finish
    invocation_s: float = INVOCATION_S  # an invocation is answered within this, as SageMaker answers it
    # the container environment, as an endpoint's model sets it
    environment: Mapping[str, str] = field(default_factory=lambda: dict(CONTAINER_ENVIRONMENT))
    # the container's Python (e.g. "3.10"): the stub runs it and tarballs run from their environments packed for it;
    # AUTO: the default container's where this machine can run its stub; None: this interpreter's stub and packages
    container_python: str | None = None

    def __post_init__(self) -> None:
        from tritonpack.server import PYTHON_VERSION, stub_path_problem

        self.source = open_source(self.models, self.s3_endpoint_url)
        cache_dir = self.cache_dir or Path.home() / ".cache" / "tritonpack" / "mme"
        if problem := stub_path_problem(cache_dir):  # Triton loads the targets from there
            raise UserError(f"--cache-dir {cache_dir}: {problem}")
        self.cache = DiskCache(Path(cache_dir), self.cache_bytes)
        container = self._stub_python()
        self.triton = SageMakerTriton(log_path=self.triton_log, environment=self.environment,
                                      invoke_timeout_s=self.invocation_s + ABANDONED_CALL_S, container_python=container)
        metrics = Metrics()
        store = TargetStore(self.source, self.cache, metrics, python=container.version if container else PYTHON_VERSION,
                            container=container is not None)
        self.manager = ModelManager(store, self.triton, self.max_models, metrics, self.policy)
        self.gateway = Gateway(self.manager, self.max_payload_bytes, invocation_s=self.invocation_s)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._bound_port: int | None = None

    def _stub_python(self) -> ContainerPython | None:
        if self.container_python != AUTO:
            return ContainerPython.find(self.container_python) if self.container_python else None
        try:
            return ContainerPython.of_default_container()
        except UserError as e:
            log.warning("python models run with this interpreter's stub and packages, not from their tarballs' "
                        "environments as on a %s endpoint: %s (--container-python local: the same without this "
                        "line)", DEFAULT_CONTAINER, e)
            return None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self._bound_port or self.port}"

    def start(self) -> LocalMME:
        try:
            self.triton.start()
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name="mme-gateway", daemon=True)
            self._thread.start()
            self._bound_port = self._run(self._listen())
        except BaseException as e:  # a port in use, a server that would not start: nothing is left running
            if self._runner is not None:
                self._run(self._runner.cleanup())
                self._runner = None
            self._stop_loop()
            self.triton.close(keep_log=isinstance(e, ServerError))  # the error names the log
            raise
        self.manager.start()
        return self

    async def _listen(self) -> int:
        self._runner = self.gateway.runner()
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, backlog=LISTEN_BACKLOG)
        await site.start()
        return self._runner.addresses[0][1]

    def stop(self) -> None:
        """Drain the gateway (`drain_s`), stop tritonserver (stubs reaped, /dev/shm regions removed) and remove the
        working folder."""
        if self._runner is not None:
            self._run(self.gateway.drain(self._runner, self.drain_s))
            self._runner = None
        self._stop_loop()
        self.manager.shutdown()
        self.triton.close()
        self.cache.close()

    def _run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def _stop_loop(self) -> None:
        if self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._thread = None
            self._loop.close()

    def __enter__(self) -> LocalMME:
        return self if self._thread is not None else self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
