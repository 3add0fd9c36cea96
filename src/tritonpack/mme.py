"""A local SageMaker multi-model endpoint: a small gateway in front of Triton's own SageMaker front-end.

The gateway plays the part of SageMaker's MME platform: it answers InvokeEndpoint
(`POST /endpoints/<name>/invocations` with `X-Amzn-SageMaker-Target-Model`) and `/ping`; on the first call for a
target it fetches the tarball (folder or S3), checks it, extracts it safely into a disk cache, loads it through
the container contract and invokes it; it keeps an LRU of loaded models, bounds the disk cache and serves
SageMaker's MME metrics in Prometheus text format at `/metrics`.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import sys
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tritonpack.model_store import DiskCache, TargetError, open_source, target_hash, validate_target
from tritonpack.sagemaker_triton import TARGET_HEADER, Reply, SageMakerTriton, TritonUnavailable

log = logging.getLogger("tritonpack.mme")
INVOCATIONS = re.compile(r"^/endpoints/([A-Za-z0-9](?:-*[A-Za-z0-9]){0,62})/invocations$")
MAX_PAYLOAD_BYTES = 6 * 1024 * 1024  # SageMaker real-time InvokeEndpoint's limit
INSUFFICIENT_STORAGE = 507
# Triton 2.51 keeps a model whose python stub died registered and ready; every request through it then fails with
# this (500 on Triton's HTTP front-end, 400 on its SageMaker front-end). The gateway reloads the target once.
STUB_UNHEALTHY = re.compile(r"Stub process '[^']*' is not healthy")


class Metrics:
    """SageMaker's MME CloudWatch metrics, named as CloudWatch names them, in Prometheus text format."""

    HELP = {
        "LoadedModelCount": ("gauge", "models loaded in Triton now"),
        "ModelCacheHit": ("counter", "invocations whose target was already loaded"),
        "ModelCacheMiss": ("counter", "invocations that had to wait for their target to be loaded"),
        "Invocations": ("counter", "InvokeEndpoint requests answered"),
        "Invocation4XXErrors": ("counter", "invocations answered with a 4xx status"),
        "Invocation5XXErrors": ("counter", "invocations answered with a 5xx status"),
        "ModelDiskEvictions": ("counter", "extracted targets removed from the disk cache"),
        "TritonRestarts": ("counter", "times tritonserver was restarted after it died"),
        "ModelReloads": ("counter", "targets unloaded and loaded again because one of their python stubs died"),
        "ModelLoadingWaitTime": ("summary", "seconds an invocation waited for its target to be fetched and loaded"),
        "ModelDownloadingTime": ("summary", "seconds spent fetching a tarball from the model source"),
        "ModelLoadingTime": ("summary", "seconds Triton took to load a target"),
        "ModelUnloadingTime": ("summary", "seconds Triton took to unload a target"),
    }

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.values: dict[str, float] = {name: 0.0 for name, (kind, _) in self.HELP.items() if kind != "summary"}
        self.summaries: dict[str, list[float]] = {name: [0, 0.0] for name, (kind, _) in self.HELP.items()
                                                  if kind == "summary"}

    def inc(self, name: str, by: float = 1.0) -> None:
        with self._lock:
            self.values[name] += by

    def set(self, name: str, value: float) -> None:
        with self._lock:
            self.values[name] = value

    def observe(self, name: str, seconds: float) -> None:
        with self._lock:
            self.summaries[name][0] += 1
            self.summaries[name][1] += seconds

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            out = dict(self.values)
            for name, (count, total) in self.summaries.items():
                out[f"{name}_count"], out[f"{name}_sum"] = count, total
            return out

    def render(self) -> str:
        values = self.snapshot()
        lines = []
        for name, (kind, help_text) in self.HELP.items():
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            if kind == "summary":
                lines += [f"{name}_count {values[name + '_count']:g}", f"{name}_sum {values[name + '_sum']:.6f}"]
            else:
                lines.append(f"{name} {values[name]:g}")
        return "\n".join(lines) + "\n"


def parse_metrics(text: str) -> dict[str, float]:
    """`name value` lines of a Prometheus text exposition (no labels), for tests and scripts."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.partition(" ")
            out[name] = float(value)
    return out


@dataclass
class Loaded:
    target: str
    active: int = 0
    last_used: float = field(default_factory=time.time)
    broken: bool = False  # a python stub of this load died: calls that fail on it are retried on the next load

    @property
    def hash(self) -> str:
        return target_hash(self.target)


class ModelManager:
    """Loads targets on first use, at most once at a time per target, and keeps at most `max_models` loaded."""

    def __init__(self, source, cache: DiskCache, triton: SageMakerTriton, max_models: int,
                 metrics: Metrics | None = None, max_restarts: int = 3):
        if max_models < 1:
            raise ValueError("max_models must be at least 1")
        self.source, self.cache, self.triton, self.max_models = source, cache, triton, max_models
        self.metrics = metrics or Metrics()
        self.max_restarts = max_restarts
        self.loaded: OrderedDict[str, Loaded] = OrderedDict()  # least recently used first
        self._pending: dict[str, Future] = {}
        self._unloading: dict[str, threading.Event] = {}
        self._rejected: dict[str, tuple[str, TargetError]] = {}  # target → (version, why) of bad tarballs
        self._broken: dict[str, str] = {}  # target → why: its python stub died; unload it before loading again
        self.stub_deaths = 0
        self._lock = threading.RLock()
        self._restart_lock = threading.Lock()
        self.restarts = 0

    # ---- invocation -----------------------------------------------------------------------------------------
    def invoke(self, target: str, body: bytes, content_type: str | None, retried: bool = False) -> Reply:
        target = validate_target(target)
        generation = self.triton.starts
        try:
            return self._invoke(target, body, content_type, retried)
        except TargetError as e:
            # A call cut short by a restart the gateway made itself (to free a dead stub) is retried once; calls cut
            # short by a crash are not (the request might be what crashed it).
            if retried or e.status < 500 or self._planned_start <= generation:
                raise
            log.info("%s: retrying a call interrupted by the planned tritonserver restart (%s)", target, e.message)
            return self.invoke(target, body, content_type, retried=True)

    def _invoke(self, target: str, body: bytes, content_type: str | None, retried: bool) -> Reply:
        self._ensure_triton()
        model = self._acquire(target)
        try:
            reply = self._call(lambda: self.triton.invoke(model.hash, target, body, content_type))
            if reply.status == INSUFFICIENT_STORAGE and self._unload_lru(keep={target}):
                reply = self._call(lambda: self.triton.invoke(model.hash, target, body, content_type))
        finally:
            with self._lock:
                model.active -= 1
                model.last_used = time.time()
        if reply.status == 404 and not reply.body and not retried:
            # Triton no longer knows the target (unloaded behind our back): forget it and load it again once.
            with self._lock:
                if self.loaded.get(target) is model and model.active == 0:
                    del self.loaded[target]
            return self.invoke(target, body, content_type, retried=True)
        if reply.status != 200 and STUB_UNHEALTHY.search(reply.message):
            if retried:
                raise TargetError(503, f"a python stub of {target!r} is dead right after the target was loaded "
                                       f"again ({reply.message}); log: {self.triton.log_path}")
            self._mark_broken(target, model, reply.message)
        if reply.status != 200 and model.broken and not retried:
            # failed on a load whose stub died: "not healthy", or "not found" while it was being unloaded
            return self.invoke(target, body, content_type, retried=True)
        return reply

    def _mark_broken(self, target: str, model: Loaded, reason: str) -> None:
        """A python stub of `target` died: the next load of it (this call's retry) unloads it first.

        Concurrent calls that met the same dead stub find it marked already and just wait for that one reload."""
        with self._lock:
            model.broken = True
            if self.loaded.get(target) is not model:
                return
            del self.loaded[target]
            self._broken[target] = reason
            self.stub_deaths += 1
            self.metrics.set("LoadedModelCount", len(self.loaded))
        log.warning("%s: a python stub died (%s): unloading and loading the target again", target, reason)

    def _acquire(self, target: str) -> Loaded:
        """The loaded target, marked active; loads it (or waits for the load in flight) when it is not loaded."""
        started = time.monotonic()
        with self._lock:
            model = self.loaded.get(target)
            if model is not None:
                self.loaded.move_to_end(target)
                model.active += 1
                self.metrics.inc("ModelCacheHit")
                return model
            future = self._pending.get(target)
            owner = future is None
            if owner:
                future = self._pending[target] = Future()
            self.metrics.inc("ModelCacheMiss")
        if owner:
            try:
                future.set_result(self._load(target))
            except BaseException as e:
                future.set_exception(e)
            finally:
                with self._lock:
                    self._pending.pop(target, None)
        model = future.result()
        with self._lock:
            model.active += 1
            if target not in self.loaded:  # unloaded again between the load and now: load it afresh
                model.active -= 1
                return self._acquire(target)
        self.metrics.observe("ModelLoadingWaitTime", time.monotonic() - started)
        return model

    def _load(self, target: str) -> Loaded:
        waiting = self._unloading.get(target)
        if waiting is not None:
            waiting.wait()
        with self._lock:
            broken = self._broken.pop(target, None)
        if broken is None:
            return self._load_fresh(target)
        if not self._unload_dead(target):
            self._restart_planned(f"a python stub of {target!r} died ({broken}) and the target did not unload "
                                  f"within {self.dead_unload_timeout_s:g} s")
        try:
            model = self._load_fresh(target)
        except TargetError as e:
            with self._lock:  # later calls try again (unload, load) and get the same 503 until it loads
                self._broken.setdefault(target, broken)
            raise TargetError(503, f"a python stub of {target!r} died ({broken}) and loading the target again "
                                   f"failed: {e.message}", e.problems) from e
        self.metrics.inc("ModelReloads")
        log.warning("%s: loaded again after its python stub died", target)
        return model

    def _unload_dead(self, target: str) -> bool:
        """Unload a target whose stub died; False when Triton does not finish within `dead_unload_timeout_s`.

        Idle, such a target unloads in 1-2 s and leaves only the dead stub's instance behind (Triton 2.51 never
        finishes that one). With requests in flight as the stub died, Triton 2.51 was seen never to finish unloading
        the ensemble (its SageMaker front-end's DELETE then waits for ever): the caller restarts tritonserver."""
        started = time.monotonic()
        try:
            reply = self.triton.unload(target_hash(target), target, timeout=self.dead_unload_timeout_s)
        except TritonUnavailable as e:
            log.warning("%s did not unload after its stub died: %s", target, e)
            return False
        self.metrics.observe("ModelUnloadingTime", time.monotonic() - started)
        if reply.status not in (200, 404):
            log.warning("unloading %s after its stub died: HTTP %d %s", target, reply.status, reply.message)
        return True

    def _restart_planned(self, why: str) -> None:
        """Stop tritonserver at once and start it again (every target loads again on first use); calls it
        interrupts are retried (see `invoke`)."""
        with self._restart_lock:
            with self._lock:
                self.loaded.clear()
                self._broken.clear()
                self.metrics.set("LoadedModelCount", 0)
            if self._stopping:
                raise TargetError(503, f"{why}; the local MME is shutting down")
            if self.restarts >= self.max_restarts:
                raise TargetError(503, f"{why}; tritonserver cannot be restarted: already restarted "
                                       f"{self.restarts} times; log {self.triton.log_path}")
            self.restarts += 1
            self.metrics.inc("TritonRestarts")
            self._planned_start = self.triton.starts + 1
            log.warning("restarting tritonserver: %s", why)
            try:
                self.triton.restart(stop_timeout_s=3.0)
            except Exception as e:  # noqa: BLE001 - reported to the caller as the reason
                raise TargetError(503, f"{why}; restarting tritonserver failed: {e}") from e

    def _load_fresh(self, target: str) -> Loaded:
        version = self.source.version(target)
        if version is None:
            raise TargetError(404, f"target model {target!r} not found at {self.source.location(target)}")
        rejected = self._rejected.get(target)
        if rejected is not None and rejected[0] == version:  # the same bad tarball: the same answer, no refetch
            raise TargetError(rejected[1].status, rejected[1].message, rejected[1].problems)
        model_dir = self.cache.lookup(target, version)
        if model_dir is None:
            try:
                model_dir = self._fetch(target, version)
            except TargetError as e:
                if e.status == 400:
                    self._rejected[target] = (version, e)
                raise
        self._make_room()
        started = time.monotonic()
        reply = self._call(lambda: self.triton.load(target_hash(target), target, model_dir))
        if reply.status == 409:  # registered already (a load that outlived our bookkeeping): start clean
            self._call(lambda: self.triton.unload(target_hash(target), target))
            reply = self._call(lambda: self.triton.load(target_hash(target), target, model_dir))
        while reply.status == INSUFFICIENT_STORAGE and self._unload_lru(keep={target}):
            reply = self._call(lambda: self.triton.load(target_hash(target), target, model_dir))
        if reply.status != 200:
            status = reply.status if 400 <= reply.status < 600 else 502
            raise TargetError(status, f"Triton could not load {target!r}: {reply.message}")
        self.metrics.observe("ModelLoadingTime", time.monotonic() - started)
        model = Loaded(target)
        with self._lock:
            self.loaded[target] = model
            self.metrics.set("LoadedModelCount", len(self.loaded))
            in_use = set(self.loaded) | set(self._pending)
        evicted = self.cache.evict(in_use)
        if evicted:
            self.metrics.inc("ModelDiskEvictions", len(evicted))
            log.info("disk cache over %d bytes: removed %s", self.cache.max_bytes, ", ".join(evicted))
        return model

    def _fetch(self, target: str, version: str) -> Path:
        """Download, check (nothing written yet), then extract safely into the disk cache."""
        from tritonpack.archive import ArchiveError
        from tritonpack.check import check
        from tritonpack.server import PYTHON_VERSION, local_python_has

        download = self.cache.staging_file(target)
        try:
            started = time.monotonic()
            try:
                self.source.fetch(target, download)
            except Exception as e:  # noqa: BLE001 - any fetch failure is the source's answer for this target
                raise TargetError(502, f"could not fetch {self.source.location(target)}: {e}") from e
            self.metrics.observe("ModelDownloadingTime", time.monotonic() - started)
            try:
                model_dir = self.cache.add(target, version, download)
            except ArchiveError as e:
                raise TargetError(400, f"{target} is not deployable: unsafe archive, nothing extracted",
                                  [str(p) for p in e.problems]) from e
            # safe_extract checked the archive before writing anything; the rest of `check` runs on the extracted
            # folder, which saves a second decompression of the tarball on every cold start.
            # The local server's python stub is this interpreter's Python: packed envs must match it.
            report = check(model_dir, python=PYTHON_VERSION, server_has=local_python_has)
            if report.problems:
                self.cache.remove(target)
                raise TargetError(400, f"{target} is not deployable", [str(p) for p in report.problems])
            return model_dir
        finally:
            shutil.rmtree(download.parent, ignore_errors=True)

    # ---- capacity ---------------------------------------------------------------------------------------------
    def _make_room(self) -> None:
        """Unload least recently used idle targets until a new one fits under `max_models`."""
        while True:
            with self._lock:
                if len(self.loaded) < self.max_models:
                    return
            if not self._unload_lru(keep=set()):
                return  # every loaded target is busy: go over the limit rather than fail the call

    def _unload_lru(self, keep: set[str]) -> bool:
        with self._lock:
            victim = next((m for m in self.loaded.values() if m.active == 0 and m.target not in keep), None)
            if victim is None:
                return False
            del self.loaded[victim.target]
            self._unloading[victim.target] = done = threading.Event()
            self.metrics.set("LoadedModelCount", len(self.loaded))
        started = time.monotonic()
        try:
            reply = self._call(lambda: self.triton.unload(victim.hash, victim.target))
            if reply.status not in (200, 404):
                log.warning("unloading %s: HTTP %d %s", victim.target, reply.status, reply.message)
            self.metrics.observe("ModelUnloadingTime", time.monotonic() - started)
        finally:
            with self._lock:
                self._unloading.pop(victim.target, None)
            done.set()
        log.info("unloaded %s (least recently used)", victim.target)
        return True

    # ---- tritonserver health ----------------------------------------------------------------------------------
    def _call(self, request):
        try:
            return request()
        except TritonUnavailable as e:
            if self.triton.alive():
                raise TargetError(502, f"tritonserver did not answer: {e}") from e
            self._recover()
            raise TargetError(503, f"tritonserver exited (code {self._last_exit}) during the request; "
                                   f"{self._recovery}") from e

    _last_exit: int | None = None
    _recovery: str = ""
    _stopping: bool = False
    _planned_start: int = 0  # the tritonserver start number of the last restart the gateway chose to make
    dead_unload_timeout_s: float = 10.0

    def _ensure_triton(self) -> None:
        if not self.triton.alive():
            self._recover()
            if not self.triton.alive():
                raise TargetError(503, f"tritonserver exited (code {self._last_exit}); {self._recovery}")

    def _recover(self) -> None:
        """Restart a dead tritonserver (at most `max_restarts` times); loaded models are gone with it."""
        with self._restart_lock:
            if self.triton.alive():
                return
            self._last_exit = self.triton.exit_code()
            if self._stopping:
                self._recovery = "the local MME is shutting down"
                return
            with self._lock:
                self.loaded.clear()
                self._broken.clear()  # gone with the old process, dead stubs included
                self.metrics.set("LoadedModelCount", 0)
            tail = self.triton.log_tail(5).replace("\n", " | ")
            if self.restarts >= self.max_restarts:
                self._recovery = (f"it cannot be restarted: already restarted {self.restarts} times; "
                                  f"log {self.triton.log_path}: {tail}")
                return
            self.restarts += 1
            self.metrics.inc("TritonRestarts")
            try:
                self.triton.restart()
                self._recovery = "it was restarted; retry the call (models load again on first use)"
            except Exception as e:  # noqa: BLE001 - reported to the caller as the reason
                self._recovery = f"restarting it failed: {e}"
            log.warning("tritonserver exited with %s; %s", self._last_exit, self._recovery)

    def loaded_targets(self) -> list[str]:
        with self._lock:
            return list(self.loaded)

    def shutdown(self) -> None:
        with self._restart_lock:  # calls still in flight must not restart the server being stopped
            self._stopping = True
        # A model whose stub died never finishes unloading in Triton 2.51 (even after our unload and reload), so
        # tritonserver would wait out its whole exit timeout (30 s): stop it after a short grace period instead.
        self.triton.stop(timeout_s=5.0 if self.stub_deaths else 30.0)


# ---- gateway --------------------------------------------------------------------------------------------------
def request_problem(body: bytes, content_type: str | None) -> str | None:
    """Why an invocation body is not a well-formed KServe v2 request (JSON or binary+json); None if it is."""
    from tritonpack.codec import header_size
    from tritonpack.errors import PayloadError
    from tritonpack.request_guard import infer_request_problem

    try:
        size = header_size(content_type)
    except PayloadError as e:
        return str(e)
    return infer_request_problem(body, None if size is None else str(size))


def error_body(code: str, message: str, status: int, problems: list | None = None, original: int | None = None):
    """A SageMaker-runtime-style error: botocore reads the code from x-amzn-ErrorType and `message` from the body."""
    data = {"ErrorCode": code, "message": message, "Message": message}
    if problems:
        data["problems"] = [str(p) for p in problems]
        data["message"] = data["Message"] = message + ": " + "; ".join(str(p) for p in problems)
    if original is not None:
        data.update(OriginalStatusCode=original, OriginalMessage=message)
    return status, json.dumps(data).encode(), code


class GatewayHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "tritonpack-mme"
    manager: ModelManager
    max_payload_bytes: int = MAX_PAYLOAD_BYTES

    def log_message(self, fmt, *args) -> None:
        log.debug("%s " + fmt, self.address_string(), *args)

    def _send(self, status: int, body: bytes, content_type: str = "application/json", headers: dict | None = None):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def _error(self, code: str, message: str, status: int, problems=None, original=None) -> None:
        status, body, code = error_body(code, message, status, problems, original)
        self._send(status, body, headers={"x-amzn-ErrorType": code})

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self.path == "/ping":
            ok = self.manager.triton.alive() and self.manager.triton.ping()
            return self._send(200 if ok else 503, b"{}" if ok else b'{"message": "tritonserver is not live"}')
        if self.path == "/metrics":
            return self._send(200, self.manager.metrics.render().encode(), "text/plain; version=0.0.4")
        if self.path == "/models":
            body = {"loaded": self.manager.loaded_targets(), "cache_bytes": self.manager.cache.total_bytes,
                    "cached": sorted(self.manager.cache.entries)}
            return self._send(200, json.dumps(body).encode())
        return self._error("UnknownOperationException", f"no such path: GET {self.path}", 404)

    def do_POST(self) -> None:  # noqa: N802
        match = INVOCATIONS.match(self.path.split("?", 1)[0])
        length = int(self.headers.get("Content-Length") or 0)
        if not match:
            self.rfile.read(length)
            return self._error("UnknownOperationException", f"no such path: POST {self.path}", 404)
        if length > self.max_payload_bytes:
            self.close_connection = True
            return self._error("ValidationError", f"payload of {length} bytes is above the "
                                                  f"{self.max_payload_bytes} byte limit", 413)
        body = self.rfile.read(length)
        target = self.headers.get(TARGET_HEADER)
        metrics = self.manager.metrics
        problem = request_problem(body, self.headers.get("Content-Type"))
        if problem:  # bodies tritonserver 2.51 would answer with 500 or wrongly accept (README, "Reliability")
            metrics.inc("Invocations")
            metrics.inc("Invocation4XXErrors")
            return self._error("ValidationError", problem, 400)
        try:
            reply = self.manager.invoke(target, body, self.headers.get("Content-Type"))
        except TargetError as e:
            metrics.inc("Invocations")
            metrics.inc("Invocation4XXErrors" if e.status < 500 else "Invocation5XXErrors")
            code = {404: "ValidationError", 400: "ValidationError"}.get(e.status, "ServiceUnavailable"
                                                                        if e.status >= 500 else "ModelError")
            return self._error(code, e.message, e.status, e.problems)
        except Exception as e:  # noqa: BLE001 - the gateway must keep serving; the reason goes to the caller
            log.exception("invocation of %s failed", target)
            metrics.inc("Invocations")
            metrics.inc("Invocation5XXErrors")
            return self._error("InternalFailure", f"{type(e).__name__}: {e}", 500)
        metrics.inc("Invocations")
        if reply.status != 200:
            metrics.inc("Invocation4XXErrors" if reply.status < 500 else "Invocation5XXErrors")
            return self._error("ModelError", f"{target}: {reply.message}", reply.status, original=reply.status)
        return self._send(200, reply.body, reply.content_type,
                          {"x-Amzn-Invoked-Production-Variant": "AllTraffic"})


@dataclass
class LocalMME:
    """`tritonpack mme` as an object: Triton (SageMaker front-end) + model manager + gateway on `host:port`."""

    models: str
    port: int = 8080
    host: str = "127.0.0.1"
    max_models: int = 8
    cache_dir: Path | None = None
    cache_bytes: int = 20 << 30
    s3_endpoint_url: str | None = None
    max_payload_bytes: int = MAX_PAYLOAD_BYTES
    triton_log: Path | None = None

    def __post_init__(self) -> None:
        self.source = open_source(self.models, self.s3_endpoint_url)
        cache_dir = self.cache_dir or Path.home() / ".cache" / "tritonpack" / "mme"
        self.cache = DiskCache(Path(cache_dir), self.cache_bytes)
        self.triton = SageMakerTriton(log_path=self.triton_log)
        self.manager = ModelManager(self.source, self.cache, self.triton, self.max_models)
        self.httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.httpd.server_address[1] if self.httpd else self.port}"

    def start(self) -> LocalMME:
        self.triton.start()
        handler = type("Handler", (GatewayHandler,), {"manager": self.manager,
                                                      "max_payload_bytes": self.max_payload_bytes})
        try:
            self.httpd = ThreadingHTTPServer((self.host, self.port), handler)
        except OSError:
            self.triton.stop()
            raise
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="mme-gateway", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
        self.manager.shutdown()

    def __enter__(self) -> LocalMME:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# ---- command line ---------------------------------------------------------------------------------------------
SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """`20G`, `512MiB`, `1000000` → bytes (binary multiples)."""
    match = SIZE.match(str(text))
    if not match:
        raise ValueError(f"not a size: {text!r} (examples: 20G, 512M, 1000000)")
    number, unit = match.groups()
    return int(float(number) * 1024 ** " kmgt".index(unit.lower() or " "))


def cmd_mme(args) -> int:
    import signal

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    mme = LocalMME(args.models, port=args.port, host=args.host, max_models=args.max_models,
                   cache_dir=Path(args.cache_dir) if args.cache_dir else None,
                   cache_bytes=parse_bytes(args.cache_bytes), s3_endpoint_url=args.s3_endpoint_url,
                   max_payload_bytes=args.max_payload_bytes)
    print(f"starting tritonserver (SageMaker front-end, MME mode); log: {mme.triton.log_path}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with mme:
        print(f"local MME on {mme.url}: models from {mme.source}, at most {args.max_models} loaded, "
              f"disk cache {mme.cache.root} ({args.cache_bytes})\n"
              f"  invoke: aws sagemaker-runtime invoke-endpoint --endpoint-url {mme.url} --endpoint-name local "
              f"--target-model <tarball> ...\n  metrics: {mme.url}/metrics", flush=True)
        try:
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
        print("stopping", flush=True)
    return 0


def add_command(subparsers) -> None:
    p = subparsers.add_parser("mme", help="serve MME tarballs locally, as a SageMaker multi-model endpoint would",
                              description=__doc__)
    p.add_argument("--models", required=True, help="folder of tarballs, or s3://bucket/prefix")
    p.add_argument("--port", type=int, default=8080, help="gateway port (default 8080; 0: a free one)")
    p.add_argument("--host", default="127.0.0.1", help="gateway address (default 127.0.0.1)")
    p.add_argument("--max-models", type=int, default=8, help="models loaded at once; least recently used are "
                                                             "unloaded beyond it (default 8)")
    p.add_argument("--cache-dir", help="where tarballs are extracted (default ~/.cache/tritonpack/mme)")
    p.add_argument("--cache-bytes", default="20G", help="disk cache bound; extracted folders of unloaded "
                                                        "models are removed beyond it (default 20G)")
    p.add_argument("--s3-endpoint-url", help="S3 endpoint for s3:// models (an S3-compatible store, moto)")
    p.add_argument("--max-payload-bytes", type=int, default=MAX_PAYLOAD_BYTES,
                   help=f"largest request body (default {MAX_PAYLOAD_BYTES}, SageMaker's limit)")
    p.set_defaults(func=cmd_mme)
