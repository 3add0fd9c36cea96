"""The sides a text experiment compares, all with one interface.

- In-process sides (`served = False`) embed the whole work in one call at the batch the goals name, as a user of
  the library would; concurrency does not apply to them.
- Served sides (`served = True`) answer `concurrency` client threads, each sending one request at a time (one
  sentence per request unless told otherwise) and taking the next from a shared cursor, on loopback.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import re
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from benchmarks.meters import CPU, Run, versions
from tritonpack.children import start_child


class Side(Protocol):
    key: str  # report key, e.g. "st_openvino_b64"
    label: str  # what a reader sees, e.g. "sentence-transformers openvino, batch 64"
    served: bool
    is_variant: bool  # another setting of a side already measured: left out of the by-length runs

    def embed(self, sentences: list[str]) -> np.ndarray: ...

    def run(self, sentences: list[str], concurrency: int = 1) -> Run: ...

    def describe(self) -> dict: ...

    def close(self) -> None: ...


class Client(Protocol):
    def embed(self, texts: Sequence[str]) -> np.ndarray: ...

    def close(self) -> None: ...


class _Unavailable:
    """The client a worker thread could not make: every call raises why."""

    def __init__(self, error: BaseException):
        self.error = error

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        raise self.error

    def close(self) -> None:
        pass


class ConcurrentClients:
    """`concurrency` threads, each with its own client, send requests (lists of sentences) to a server.

    Threads persist across runs and each owns its client (tritonclient's HTTP client must stay on the thread
    that made it), so connection set-up is not timed.
    """

    def __init__(self, make_client: Callable[[], Client]):
        self.make_client = make_client
        self._workers: list[tuple[threading.Thread, queue.Queue]] = []

    def _worker(self, tasks: queue.Queue) -> None:
        try:
            client = self.make_client()
        except BaseException as e:  # noqa: BLE001 - each task this thread takes raises it in the calling thread
            client = _Unavailable(e)
        try:
            while (task := tasks.get()) is not None:
                task(client)
        finally:
            client.close()

    def send(self, requests: list[list[str]], concurrency: int) -> tuple[Run, list[np.ndarray]]:
        while len(self._workers) < concurrency:
            tasks: queue.Queue = queue.Queue()
            thread = threading.Thread(target=self._worker, args=(tasks,), daemon=True)
            thread.start()
            self._workers.append((thread, tasks))
        results: list = [None] * len(requests)
        latencies: list = [None] * len(requests)
        errors: list[BaseException] = []
        cursor = iter(range(len(requests)))
        lock = threading.Lock()
        finished = threading.Semaphore(0)

        def work(client: Client) -> None:
            try:
                while not errors:
                    with lock:
                        i = next(cursor, None)
                    if i is None:
                        return
                    t = time.perf_counter()
                    results[i] = client.embed(requests[i])
                    latencies[i] = 1000 * (time.perf_counter() - t)
            except BaseException as e:  # noqa: BLE001 - re-raised in the calling thread
                errors.append(e)
            finally:
                finished.release()

        start = time.perf_counter()
        for _, tasks in self._workers[:concurrency]:
            tasks.put(work)
        for _ in range(concurrency):
            finished.acquire()
        seconds = time.perf_counter() - start
        if errors:
            raise errors[0]
        return Run(sum(len(r) for r in requests), seconds, latencies), results

    def close(self) -> None:
        for _, tasks in self._workers:
            tasks.put(None)
        for thread, _ in self._workers:
            thread.join(timeout=10)
        self._workers.clear()


class ServedSide:
    """A served embedding endpoint reached through `make_client`; `details` go into the report; `stop` (if any)
    stops the server when the side is closed."""

    served = True
    is_variant = False

    def __init__(self, key: str, label: str, make_client: Callable[[], Client], details: dict,
                 stop: Callable[[], None] | None = None):
        self.key, self.label, self.details, self.stop = key, label, details, stop
        self.clients = ConcurrentClients(make_client)

    def embed(self, sentences: list[str]) -> np.ndarray:
        return np.concatenate(self.clients.send([[s] for s in sentences], 8)[1])

    def run(self, sentences: list[str], concurrency: int = 1) -> Run:
        return self.clients.send([[s] for s in sentences], concurrency)[0]

    def run_requests(self, requests: list[list[str]], concurrency: int) -> Run:
        return self.clients.send(requests, concurrency)[0]

    def describe(self) -> dict:
        return {"label": self.label, "served": True, **self.details}

    def close(self) -> None:
        self.clients.close()
        if self.stop is not None:
            self.stop()


class TritonHttpClient:
    """tritonclient's HTTP client (what SageMaker's invoke path and `tritonpack infer` speak) calling one of
    `tritonpack.client`'s ensemble functions: `embed` (text, the default) or `scores` (images)."""

    def __init__(self, url: str, model: str, call: Callable | None = None):
        import tritonclient.http as client_module

        from tritonpack import client

        self.model, self.call = model, call or client.embed
        self.client = client_module.InferenceServerClient(url)

    def embed(self, items: Sequence) -> np.ndarray:
        return self.call("", self.model, items, client=self.client)

    def close(self) -> None:
        self.client.close()


def encoder_settings(repository: Path, model: str = "bert") -> dict[str, str]:
    """The served encoder's parameters from its config.pbtxt (framework, precision asked for, packing …): the
    precision it computes is the CPU's pick at load (`logged_computes`)."""
    from tritonpack.spec import config_parameters, parse_config

    return config_parameters(parse_config((Path(repository) / f"{model}_encoder" / "config.pbtxt").read_text()))


UNKNOWN = "unknown"
# what the runner logs at load once its session passed the build's reference texts (runner_batching.py)
COMPUTES_LOGGED = re.compile(r"reference texts: min cosine \S+ to the build's \((.+)\)\"?$", re.MULTILINE)


def logged_computes(log: str) -> str:
    """What the served encoder computes on this CPU as its runner logged it at load (instances that differ are all
    named), or "unknown": a runner without the build's reference texts logs nothing."""
    return " / ".join(dict.fromkeys(COMPUTES_LOGGED.findall(log))) or UNKNOWN


def encoder_precision(framework: str, computes: str) -> str:
    """e.g. "openvino bf16, bf16+f32 up to 16 tokens", or "openvino, precision unknown"."""
    return f"{framework}, precision {UNKNOWN}" if computes == UNKNOWN else f"{framework} {computes}"


def describe_encoder(params: dict[str, str], computes: str) -> str:
    """Its precision, then its packing: e.g. "openvino bf16, bf16+f32 up to 16 tokens; packed ≤ 256 tokens"."""
    packed = f"; packed ≤ {params['max_pack_tokens']} tokens" if "max_pack_tokens" in params else ""
    return encoder_precision(params["framework"], computes) + packed


def served_tritonpack(server, repository: Path, model: str = "bert") -> ServedSide:
    """`model` served by `server`, whose log is its own (`Bench.serve` starts each server on an empty log)."""
    settings = encoder_settings(repository, model)
    computes = logged_computes(server.log_path.read_text(errors="replace"))
    label = f"served tritonpack {model} ({encoder_precision(settings['framework'], computes)})"
    return ServedSide("tritonpack", label, lambda: TritonHttpClient(server.url, model),
                      {"server": "tritonserver 2.51 (nvidia-pytriton)", "client": "tritonclient HTTP",
                       "repository": str(repository), "encoder": describe_encoder(settings, computes),
                       "encoder_computes": computes, "encoder_settings": settings,
                       "versions": versions(("nvidia-pytriton", "tritonclient", "openvino", "onnxruntime"))})


WORKER = Path(__file__).with_name("peer_worker.py")


class PeerWorker:
    """A `peer_worker.py` process, in the Python that has the backend installed (.venv for torch, a peer venv for
    openvino/onnx), with one sentence-transformers model loaded. Its process group is CPU-metered."""

    def __init__(self, python: Path, backend: str, model: Path, export_dir: Path | None, environment: str,
                 log: Path):
        self.backend, self.environment, self.log = backend, environment, log
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as stderr:  # the libraries' progress bars and warnings
            self.process = start_child(
                [str(python), str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True,
                start_new_session=True, env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
        CPU.watch(self.process.pid)
        try:
            self.info = self.ask({"op": "load", "model": str(model), "backend": backend,
                                  "export_dir": str(export_dir) if export_dir else None})
        except BaseException:
            self.close()
            raise

    def ask(self, request: dict) -> dict:
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            raise RuntimeError(f"sentence-transformers {self.backend}: the worker exited with {self.process.wait()}; "
                               f"log: {self.log}")
        try:
            answer = json.loads(line)
        except json.JSONDecodeError:
            raise RuntimeError(f"sentence-transformers {self.backend}: the worker answered {line[:80]!r}, not JSON; "
                               f"log: {self.log}") from None
        if "error" in answer:
            raise RuntimeError(f"sentence-transformers {self.backend}: {answer['error']}")
        return answer

    def close(self) -> None:
        CPU.forget(self.process.pid)
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(timeout=60)
        self.process.stdout.close()


class SentenceTransformersSide:
    """`SentenceTransformer.encode(batch_size=…)` in a worker process, timed inside the worker around `encode`
    only. Variants (another batch size, torch threads) share the worker; the side made with it closes it."""

    served = False

    def __init__(self, worker: PeerWorker, batch_size: int, torch_threads: int | None = None,
                 is_variant: bool = False):
        self.worker, self.batch_size, self.torch_threads, self.is_variant = worker, batch_size, torch_threads, \
            is_variant
        threads = f"_{torch_threads}thread" if torch_threads else ""
        self.key = f"st_{worker.backend}_b{batch_size}{threads}"
        self.label = f"sentence-transformers {worker.backend}, batch {batch_size}" + \
            (f", torch on {torch_threads} thread{'s' if torch_threads > 1 else ''}" if torch_threads else "")

    def _encode(self, sentences: list[str], embeddings: bool) -> dict:
        return self.worker.ask({"op": "encode", "sentences": sentences, "batch_size": self.batch_size,
                                "torch_threads": self.torch_threads, "embeddings": embeddings})

    def embed(self, sentences: list[str]) -> np.ndarray:
        answer = self._encode(sentences, True)
        return np.frombuffer(base64.b64decode(answer["embeddings"]), dtype=np.float32).reshape(answer["shape"])

    def run(self, sentences: list[str], concurrency: int = 1) -> Run:
        return Run(len(sentences), self._encode(sentences, False)["seconds"])

    def variant(self, batch_size: int, torch_threads: int | None = None) -> SentenceTransformersSide:
        return SentenceTransformersSide(self.worker, batch_size, torch_threads, is_variant=True)

    def describe(self) -> dict:
        info = self.worker.info
        return {"label": self.label, "served": False, "environment": self.worker.environment,
                "versions": info["versions"], "load_s": info["load_s"], "loaded_from": info["loaded_from"]}

    def close(self) -> None:
        if not self.is_variant:
            self.worker.close()


def cosine_min(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((a * b).sum(axis=1).min())
