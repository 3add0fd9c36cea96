"""The gateway: SageMaker's InvokeEndpoint, `/ping`, `/metrics` and `/models` in front of the model manager.

It runs on aiohttp's server, which validates HTTP framing itself (a malformed or negative Content-Length, bad
chunking, oversized headers: 400 before any handler runs) and counts body bytes as they arrive (413 past the limit,
chunked or not). The gateway adds 411 for a body without a length, 405 with `Allow` for a wrong method, and reads
headers as UTF-8, as boto3 sends a non-ASCII TargetModel, 400 for a body that does not decode as its
Content-Encoding says, and 408 for a body that does not arrive in time; a connection that sends no request is closed
after `IDLE_CONNECTION_S`. Invocations run in a thread pool (the manager blocks on Triton) that slow or hung targets
cannot fill, nor first calls of targets not loaded yet (`InvokeThreads`), and are answered within SageMaker's
`INVOCATION_S`: a target still loading then gets 429 ModelNotReadyException while its load goes on, a loaded one that
has not answered 424 ModelError. The requests the gateway holds (reading, waiting or running) are bounded per target
(`HELD_PER_TARGET`) and in bytes of bodies (`HELD_BODIES`): past that, 429 ThrottlingException with Retry-After before
the body is read, which boto3 retries on its own. Probes run in another pool, so `/ping` stays quick under load.
`drain` is the graceful half of stopping.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_urldispatcher import _default_expect_handler  # 100 Continue, as a route without a handler of its own

from tritonpack.aws import one_line
from tritonpack.codec import HEADER_SIZE
from tritonpack.mme.container import TARGET_HEADER, Reply
from tritonpack.mme.manager import ModelManager
from tritonpack.mme.request_guard import MAX_PAYLOAD_BYTES, infer_request_problem
from tritonpack.mme.sources import TargetError
from tritonpack.mme.store import INSUFFICIENT_STORAGE

log = logging.getLogger("tritonpack.mme")
ENDPOINT_NAME = re.compile(r"[A-Za-z0-9](?:-*[A-Za-z0-9]){0,62}")
INVOKE_THREADS = 64
MAX_CALLS_PER_TARGET = INVOKE_THREADS // 4
RESERVED_THREADS = INVOKE_THREADS // 4  # free to targets with no call running: the busy ones share the rest
LOADED_THREADS = INVOKE_THREADS // 8  # of those, free to loaded targets only: a call that loads may take minutes
HELD_PER_TARGET = INVOKE_THREADS  # requests of one target in the gateway at once (reading, waiting or running)
HELD_BODIES = INVOKE_THREADS // 2  # bytes of bodies the gateway holds at once, in bodies at the payload limit
THROTTLED_RETRY_S = 1.0
DRAIN_GRACE_S = 1.0
INVOCATION_S = 60.0  # SageMaker answers an invocation within this, loading the target included
BODY_READ_S = INVOCATION_S
IDLE_CONNECTION_S = 75.0  # aiohttp's default keeps a connection that never sends a whole request for an hour
HEADER_SIZE_FIELD = f"content type's {HEADER_SIZE.rstrip('=')}"  # what a SageMaker client sets the JSON's length in
LINGER_S = 2.0  # how long an unread request body (past the limit) is read and dropped before the connection closes


def request_problem(body: bytes, content_type: str | None) -> str | None:
    """Why an invocation body is not a well-formed KServe v2 request (JSON or binary+json); None if it is."""
    from tritonpack.codec import header_size
    from tritonpack.errors import PayloadError

    try:
        size = header_size(content_type)
    except PayloadError as e:
        return str(e)
    return infer_request_problem(body, None if size is None else str(size), HEADER_SIZE_FIELD)


MODEL_STATUS = web.ResponseKey("model_status", int)  # what the 4XX/5XX metrics count, as CloudWatch's do


def error_response(code: str, message: str, status: int, problems: list | None = None, original: Reply | None = None,
                   retry_after: float | None = None) -> web.Response:
    """A SageMaker-runtime-style error: botocore reads the code from x-amzn-ErrorType and `message` from the body;
    the container's own answer, when there is one, goes beside it as SageMaker passes it on."""
    data = {"ErrorCode": code, "message": message, "Message": message}
    if problems:
        data["problems"] = [str(p) for p in problems]
        data["message"] = data["Message"] = message + ": " + "; ".join(str(p) for p in problems)
    if original is not None:
        data.update(OriginalStatusCode=original.status, OriginalMessage=original.body.decode(errors="replace"))
    headers = {"x-amzn-ErrorType": code}
    if retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(retry_after)))
    return web.json_response(data, status=status, headers=headers)


class OneLineBadRequests(logging.Filter):
    """aiohttp logs each malformed request it answered 400 with a traceback; the reason on one line is enough."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, web.RequestPayloadError):  # a body that does not decode, once the handler answered 400
            error = error.__cause__
        if isinstance(error, HttpProcessingError):
            record.msg, record.args = f"{record.getMessage()}: {one_line(error.message, 300)}", ()
            record.exc_info, record.levelno, record.levelname = None, logging.INFO, "INFO"
        return True


class InvokeThreads:
    """Admission to the invocation threads, in the event loop: at most `per_target` calls of one target at a time,
    and a target with a call running gets another thread only while more than `reserved` are free, so that slow or
    hung targets together leave threads to the others; the first call of a target not loaded (it downloads, checks,
    loads, waits for a slot) only while more than `reserved_for_loaded` are free, so that cold starts leave threads
    to loaded targets. Calls that wait hold no thread; a thread counts until its call ends, also when its caller was
    answered first (`INVOCATION_S`)."""

    def __init__(self, threads: int, per_target: int, reserved: int, reserved_for_loaded: int):
        self.free, self.per_target, self.reserved = threads, per_target, reserved
        self.reserved_for_loaded = reserved_for_loaded
        self._running: dict[str | None, int] = {}
        self._changed = asyncio.Condition()

    def _may_start(self, target: str | None, loaded: bool) -> bool:
        running = self._running.get(target, 0)
        kept = self.reserved if running else (0 if loaded else self.reserved_for_loaded)  # threads left to others
        return running < self.per_target and self.free > kept

    async def acquire(self, target: str | None, loaded: bool) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self._may_start(target, loaded))
            self.free -= 1
            self._running[target] = self._running.get(target, 0) + 1

    def release(self, target: str | None) -> None:
        self.free += 1
        self._running[target] -= 1
        if not self._running[target]:  # every name a client sends would stay otherwise
            del self._running[target]
        asyncio.ensure_future(self._notify())

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()


class Gateway:
    def __init__(self, manager: ModelManager, max_payload_bytes: int = MAX_PAYLOAD_BYTES,
                 body_read_s: float = BODY_READ_S, idle_connection_s: float = IDLE_CONNECTION_S,
                 invocation_s: float = INVOCATION_S):
        self.manager, self.metrics, self.max_payload_bytes = manager, manager.metrics, max_payload_bytes
        self.body_read_s, self.idle_connection_s, self.invocation_s = body_read_s, idle_connection_s, invocation_s
        self._invokers = ThreadPoolExecutor(INVOKE_THREADS, thread_name_prefix="mme-invoke")
        self._threads = InvokeThreads(INVOKE_THREADS, MAX_CALLS_PER_TARGET, RESERVED_THREADS, LOADED_THREADS)
        self.held: dict[str | None, int] = {}  # requests in the gateway, per target (`HELD_PER_TARGET`)
        self.held_bytes = 0  # and the bytes of their bodies, counted before they are read
        self.max_held_bytes = HELD_BODIES * max_payload_bytes
        self._probes = ThreadPoolExecutor(4, thread_name_prefix="mme-probe")
        self.draining = False
        self._in_flight = 0
        self._idle, self._deadline = asyncio.Event(), asyncio.Event()
        self._idle.set()
        self.app = web.Application(client_max_size=max_payload_bytes, middlewares=[self._sagemaker_errors])
        self.app.router.add_get("/ping", self.ping)
        self.app.router.add_get("/metrics", self.metrics_text)
        self.app.router.add_get("/models", self.models)
        self.app.router.add_post("/endpoints/{endpoint}/invocations", self.invocations,
                                 expect_handler=self._continue_within_limit)
        server_log = logging.getLogger("aiohttp.server")
        if not any(isinstance(f, OneLineBadRequests) for f in server_log.filters):
            server_log.addFilter(OneLineBadRequests())

    def runner(self) -> web.AppRunner:
        return web.AppRunner(self.app, access_log=None, shutdown_timeout=5.0, lingering_time=LINGER_S,
                             keepalive_timeout=self.idle_connection_s)

    @web.middleware
    async def _sagemaker_errors(self, request: web.Request, handler) -> web.StreamResponse:
        """aiohttp's own 404/405/413 answers, as SageMaker-style error bodies (405 keeps its `Allow`)."""
        try:
            return await handler(request)
        except web.HTTPException as e:
            if e.status < 400:
                raise
            if e.status == 413:  # a chunked body past the limit: the rest is not read
                response = error_response("ValidationError", f"payload above the {self.max_payload_bytes} byte "
                                                             f"limit", 413)
                response.force_close()
                return self._counted(response)
            code = "UnknownOperationException" if e.status in (404, 405) else "ValidationError"
            response = error_response(code, f"{e.reason}: {request.method} {request.path}", e.status)
            if "Allow" in e.headers:
                response.headers["Allow"] = e.headers["Allow"]
            return response

    # ---- routes -----------------------------------------------------------------------------------------------
    async def ping(self, request: web.Request) -> web.Response:
        ok = not self.draining and await asyncio.get_running_loop().run_in_executor(self._probes, self.manager.ready)
        if ok:
            return web.json_response({})
        return web.json_response({"message": "shutting down" if self.draining else "tritonserver is not live"},
                                 status=503, headers={"Retry-After": "1"})

    async def metrics_text(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render().encode(), headers={"Content-Type": "text/plain; version=0.0.4"})

    async def models(self, request: web.Request) -> web.Response:
        manager, cache = self.manager, self.manager.store.cache
        loaded = manager.loaded_targets()
        memory = await asyncio.get_running_loop().run_in_executor(self._probes, manager.memory_mb, loaded)
        return web.json_response({"loaded": loaded, "quarantined": manager.crashes.quarantined(),
                                  "cache_bytes": cache.total_bytes, "cached": sorted(cache.entries),
                                  "memory_mb": memory})

    async def _continue_within_limit(self, request: web.Request) -> web.Response | None:
        """`Expect: 100-continue`: a body above the payload limit is refused before the client sends it, where
        aiohttp's own handler invited it with 100 Continue first."""
        if (request.content_length or 0) > self.max_payload_bytes:
            return self._payload_too_large(request.content_length)
        return await _default_expect_handler(request)

    def _payload_too_large(self, length: int) -> web.Response:
        response = error_response("ValidationError", f"payload of {length} bytes is above the "
                                                     f"{self.max_payload_bytes} byte limit", 413)
        response.force_close()  # the body is not read
        return self._counted(response)

    async def invocations(self, request: web.Request) -> web.Response:
        if not ENDPOINT_NAME.fullmatch(request.match_info["endpoint"]):
            raise web.HTTPNotFound()
        if self.draining:
            return self._counted(self._shutting_down())
        chunked = "chunked" in request.headers.get("Transfer-Encoding", "").lower()
        if request.content_length is None and not chunked:
            return self._counted(error_response("ValidationError", "an invocation needs a body with Content-Length "
                                                                   "(or chunked transfer encoding)", 411))
        if (request.content_length or 0) > self.max_payload_bytes:
            return self._payload_too_large(request.content_length)
        target = request.headers.get(TARGET_HEADER)
        # a body whose size is not known before it is read (chunked, compressed) counts as the payload limit
        size = self.max_payload_bytes if chunked or "Content-Encoding" in request.headers else request.content_length
        if self.held.get(target, 0) >= HELD_PER_TARGET or self.held_bytes + size > self.max_held_bytes:
            return self._counted(self._throttled(target))
        self.held[target] = self.held.get(target, 0) + 1
        self.held_bytes += size
        try:
            return await self._read_and_answer(request, target)
        finally:
            self.held_bytes -= size
            self.held[target] -= 1
            if not self.held[target]:
                del self.held[target]

    async def _read_and_answer(self, request: web.Request, target: str | None) -> web.Response:
        try:
            body = await asyncio.wait_for(request.read(), self.body_read_s)  # past client_max_size: 413
        except ConnectionResetError:  # aiohttp's ClientConnectionResetError too: nobody to answer
            log.info("the client of an invocation of %r closed its connection before sending the whole body", target)
            return web.Response(status=400)
        except asyncio.TimeoutError:
            response = error_response("ValidationError", f"the request body did not arrive within "
                                                         f"{self.body_read_s:g} s", 408)
            response.force_close()
            return self._counted(response)
        except web.RequestPayloadError as e:  # a gzip, deflate or br body that does not decode
            reason = getattr(e.__cause__, "message", None) or str(e).replace("\n", " ")
            response = error_response("ValidationError", f"the request body does not decode: {reason}", 400)
            response.force_close()
            return self._counted(response)
        content_type = request.headers.get("Content-Type")
        if content_type is not None and not content_type.isascii():
            return self._counted(error_response("ValidationError", "Content-Type must be ASCII", 400))
        self._in_flight += 1
        self._idle.clear()
        try:
            return self._counted(await self._answer(target, body, content_type))
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()

    async def _answer(self, target: str | None, body: bytes, content_type: str | None) -> web.Response:
        work = asyncio.ensure_future(self._call(target, body, content_type))
        deadline = asyncio.ensure_future(self._deadline.wait())
        await asyncio.wait({work, deadline}, timeout=self.invocation_s, return_when=asyncio.FIRST_COMPLETED)
        deadline.cancel()
        if not work.done():  # the call's late result is dropped; its thread ends it
            work.cancel()
            return self._shutting_down() if self._deadline.is_set() else self._timed_out(target)
        try:
            reply = work.result()
        except TargetError as e:
            return error_response(e.code, e.message, e.status, e.problems, retry_after=e.retry_after)
        except Exception as e:  # noqa: BLE001 - the gateway must keep serving; the reason goes to the caller
            log.exception("invocation of %s failed", target)
            return error_response("InternalFailure", f"{type(e).__name__}: {e}", 500)
        if reply.status == INSUFFICIENT_STORAGE:  # Triton is out of memory and no idle target could be unloaded
            return error_response("ModelError", f"{target}: {reply.message}", reply.status, original=reply)
        if reply.status != 200:  # as SageMaker answers a model's error: 424, the model's own status beside it
            kind = "client" if reply.status < 500 else "server"
            response = error_response("ModelError", f"Received {kind} error ({reply.status}) from model {target!r} "
                                                    f"with message \"{reply.message}\"", 424, original=reply)
            response[MODEL_STATUS] = reply.status
            return response
        return web.Response(body=reply.body, headers={"Content-Type": reply.content_type,
                                                      "x-Amzn-Invoked-Production-Variant": "AllTraffic"})

    async def _call(self, target: str | None, body: bytes, content_type: str | None) -> Reply:
        await self._threads.acquire(target, loaded=self.manager.loaded(target))
        try:
            work = asyncio.wrap_future(self._invokers.submit(self._invoke, target, body, content_type))
        except BaseException:
            self._threads.release(target)
            raise
        work.add_done_callback(lambda _: self._threads.release(target))
        work.add_done_callback(lambda done: done.cancelled() or done.exception())  # read, also once dropped
        return await asyncio.shield(work)

    def _timed_out(self, target: str | None) -> web.Response:
        """SageMaker's answers to an invocation still running at `invocation_s`."""
        if self.manager.loaded(target):
            return error_response("ModelError", f"Received server error (0) from model {target!r} with message "
                                                f"\"no answer within {self.invocation_s:g} s, SageMaker's limit on an "
                                                f"invocation\"", 424)
        waits_for = "its load goes on" if self.manager.loading(target) else "it waits for a model slot or tritonserver"
        return error_response("ModelNotReadyException", f"{target!r} is not loaded yet after {self.invocation_s:g} s; "
                                                         f"{waits_for}: try again", 429, retry_after=5)

    def _invoke(self, target: str | None, body: bytes, content_type: str | None) -> Reply:
        problem = request_problem(body, content_type)  # bodies tritonserver 2.51 would answer 500 or wrongly accept
        if problem:
            raise TargetError(400, problem)
        return self.manager.invoke(target, body, content_type)

    def _throttled(self, target: str | None) -> web.Response:
        """429 before the body is read: the gateway holds as many requests of `target`, or bytes of bodies, as it
        may (a throttling answer, which SDKs retry with backoff)."""
        if self.held.get(target, 0) >= HELD_PER_TARGET:
            why = f"{HELD_PER_TARGET} invocations of {target!r}"
        else:
            why = f"{self.held_bytes / 1e6:.0f} MB of request bodies, its bound"
        response = error_response("ThrottlingException", f"the local MME holds {why} already; try again", 429,
                                  retry_after=THROTTLED_RETRY_S)
        response.force_close()  # the body is not read
        return response

    def _shutting_down(self) -> web.Response:
        response = error_response("ServiceUnavailable", "the local MME is shutting down; try again", 503,
                                  retry_after=5)
        response.force_close()
        return response

    def _counted(self, response: web.Response) -> web.Response:
        self.metrics.inc("Invocations")
        status = response.get(MODEL_STATUS, response.status)
        if status >= 400:
            self.metrics.inc("Invocation4XXErrors" if status < 500 else "Invocation5XXErrors")
        return response

    # ---- stopping ---------------------------------------------------------------------------------------------
    async def drain(self, runner: web.AppRunner, timeout_s: float) -> None:
        """Stop accepting connections, answer new requests on open ones 503 with Retry-After (and close them), let
        calls in flight finish for up to `timeout_s` and answer the rest 503 too; then close every connection.
        Open connections get at least `DRAIN_GRACE_S`, so that a keep-alive client sending its next request gets the
        503 instead of a reset."""
        for site in list(runner.sites):
            await site.stop()
        self.draining = True
        grace = asyncio.ensure_future(asyncio.sleep(min(DRAIN_GRACE_S, timeout_s)))
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except asyncio.TimeoutError:
            log.warning("%d calls still running after %g s of draining: answered 503", self._in_flight, timeout_s)
        self._deadline.set()
        await grace
        await runner.cleanup()
        self._invokers.shutdown(wait=False, cancel_futures=True)
        self._probes.shutdown(wait=False, cancel_futures=True)
