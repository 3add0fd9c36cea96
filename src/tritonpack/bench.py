"""`tritonpack bench`: served ensembles side by side with what a user would otherwise run in-process.

Every ratio alternates its two sides several times in one run (A B, B A, A B, ...) so that load from other
processes falls on both alike, and the median of the per-repetition ratios is reported. Writes
`dist/bench/report.md`, `report.json` and PNG plots. `--mode smoke` runs a small corpus once (CI checks that
the report is produced, never that a number is reached).

    P1  served `bert`, one sentence per request at concurrency 1/4/8/16 ÷ in-process sentence-transformers
    P2  served `bert` ÷ its bare encoder in-process (same ONNX, runtime and precision, same batches, +
        tokenization and pooling)
    P3  dynamic batching on ÷ off, concurrency 8
    P4  MME cold start: tarball on disk → first response, through tritonserver's SageMaker front-end
    P5  served `resnet_pt` ÷ DALI + torch in-process; DALI CPU preprocessing ÷ PIL/numpy (when it exists)
    P6  sizes of the tarballs and packed environments
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import platform
import queue
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from tritonpack.components import MODELS_DIR

SLA_SECONDS = 60.0  # SageMaker's invoke timeout; a cold load must fit well inside it
TARGETS = {  # ratio name → (target, higher is better); from issue 5
    "P1_c8": 1.5, "P2_batch32": 0.9, "P2_single_c4": 0.7, "P3_c8": 2.0, "P5_served_vs_direct": 0.85,
}
COLD_START_TARGET_S = 5.0
TEXT_ENV_TARGET_MB = 50.0


@dataclass(frozen=True)
class BenchSettings:
    mode: str = "full"  # full | smoke
    sentences: int = 384
    repetitions: int = 5
    concurrencies: tuple[int, ...] = (1, 4, 8, 16)
    st_batch_size: int = 32  # sentence-transformers' default
    request_batch: int = 32  # P2's sentences per request
    # served client: HTTP, what SageMaker's invoke path and `tritonpack infer` speak; P1 measures gRPC beside it at c=8
    protocol: str = "http"
    seed: int = 5
    out: Path = Path("dist/bench")
    dist: Path = Path("dist")

    @classmethod
    def for_mode(cls, mode: str, **overrides) -> BenchSettings:
        if mode == "smoke":
            base = cls(mode="smoke", sentences=48, repetitions=1, concurrencies=(1, 8))
        elif mode == "full":
            base = cls()
        else:
            raise ValueError(f"unknown bench mode {mode!r}; full or smoke")
        return replace(base, **{k: v for k, v in overrides.items() if v is not None})


# ---------------------------------------------------------------------------------------------- corpus

_SUBJECTS = ["The new model server", "Our on-call engineer", "A customer in Lisbon", "The nightly batch job",
             "This tokenizer", "Every replica", "The quarterly report", "My neighbour's cat", "The API gateway",
             "A tired data scientist", "The hospital's triage system", "Anna", "The weather service",
             "Ein Kunde aus München", "The small bakery on Rue Cler", "Our recommendation engine"]
_VERBS = ["rejected", "summarised", "cached", "translated", "forgot", "measured", "approved", "ranked",
          "retried", "compressed", "explained", "shipped", "misread", "indexed", "scheduled", "ignored"]
_OBJECTS = ["the overdue invoice", "three thousand support tickets", "a malformed JSON payload",
            "the holiday schedule", "every image uploaded yesterday", "the pricing page", "a 404 error",
            "its own latency budget", "the recipe for sourdough bread", "the contract renewal",
            "all sentences longer than 256 tokens", "the café's Wi-Fi password", "the GPU quota request"]
_CLAUSES = ["because the queue delay was set too high", "while the cluster was being upgraded",
            "although nobody had asked for it", "after the deployment finished at 03:14 UTC",
            "so that the dashboard would stop flickering", "before lunch on a rainy Tuesday",
            "even though the p99 latency doubled", "which surprised the whole team",
            "and then wrote a long post-mortem about padding, batching and thread pools",
            "since the previous version returned embeddings of the wrong dimension",
            "when the traffic spiked to 1,200 requests per second during the product launch"]
_SHORT = ["Thanks!", "Is it down again?", "Refund please.", "Great product, would buy again.", "Why?",
          "Ok 👍", "Where is my order #48213?", "Das ist gut.", "C'est la vie.", "Not bad at all."]


def corpus(n: int, seed: int = 5) -> list[str]:
    """`n` deterministic sentences of mixed lengths (2 to ~90 tokens), some short replies, some long ones."""
    rng = random.Random(seed)
    sentences = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.15:
            sentences.append(rng.choice(_SHORT))
            continue
        parts = [f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}"]
        for _ in range(0 if kind < 0.45 else 1 if kind < 0.8 else rng.randint(2, 4)):
            parts.append(rng.choice(_CLAUSES))
        sentences.append(", ".join(parts) + rng.choice([".", ".", "!", "?"]))
    return sentences


# ---------------------------------------------------------------------------------------------- machine


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def process_stats():
    """(pid, process group, user + system clock ticks, command line) of every process readable in /proc."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()  # fields after the command name; [2] is the group
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            yield int(entry.name), int(fields[2]), int(fields[11]) + int(fields[12]), cmd


def other_processes(top: int = 5) -> list[dict]:
    """The busiest processes (by CPU time in the last second) that are not this bench or its server."""
    mine = {os.getpid()}
    before = {pid: ticks for pid, _, ticks, _ in process_stats()}
    time.sleep(1.0)
    hz = os.sysconf("SC_CLK_TCK")
    busy = [{"pid": pid, "cpu_percent": round(100 * (ticks - before[pid]) / hz), "command": cmd[:120]}
            for pid, _, ticks, cmd in process_stats() if pid in before and pid not in mine]
    return sorted([b for b in busy if b["cpu_percent"] > 5], key=lambda b: -b["cpu_percent"])[:top]


def machine() -> dict:
    return {
        "cores": os.cpu_count(),
        "cpu_model": cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    }


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    names = ["nvidia-pytriton", "tritonclient", "onnxruntime", "openvino", "onnx", "torch", "sentence-transformers",
             "transformers", "tokenizers", "numpy", "nvidia-dali-cuda120", "pillow", "matplotlib"]
    found = {}
    for name in names:
        with contextlib.suppress(PackageNotFoundError):
            found[name] = version(name)
    found["tritonserver"] = "2.51 (bundled in nvidia-pytriton 0.7.0)"
    return found


class LoadMonitor:
    """Samples the 1-minute load average while the bench runs: other engineers' work shows up here."""

    def __init__(self, interval_s: float = 2.0):
        self.samples: list[float] = []
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(os.getloadavg()[0])
            self._stop.wait(self.interval_s)

    def __enter__(self) -> LoadMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        s = self.samples or [os.getloadavg()[0]]
        return {"load1_min": min(s), "load1_median": statistics.median(s), "load1_max": max(s),
                "samples": len(s)}


# ---------------------------------------------------------------------------------------------- measuring


@dataclass
class Run:
    """One timed pass of one side over the same work.

    `cpu_seconds`: CPU time this bench process and every tritonserver it started (stubs included) used during
    the pass. On a machine other processes load, wall-clock throughput depends on how many runnable threads
    each side has (the scheduler shares the cores per thread); items per CPU-second does not.
    """

    items: int
    seconds: float
    latencies_ms: list[float] = field(default_factory=list)
    cpu_seconds: float | None = None

    @property
    def per_second(self) -> float:
        return self.items / self.seconds

    @property
    def per_cpu_second(self) -> float | None:
        return self.items / self.cpu_seconds if self.cpu_seconds else None


class CpuMeter:
    """CPU seconds (user + system) used so far by this process and the process groups of registered servers."""

    def __init__(self) -> None:
        self.groups: list[int] = []
        self.hz = os.sysconf("SC_CLK_TCK")

    def seconds(self) -> float:
        total = sum(os.times()[:2])
        if self.groups:
            total += sum(ticks for _, group, ticks, _ in process_stats() if group in self.groups) / self.hz
        return total

    def measure(self, side: Callable[[], Run]) -> Run:
        before = self.seconds()
        run = side()
        run.cpu_seconds = self.seconds() - before
        return run


CPU = CpuMeter()


def percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def alternate(sides: dict[str, Callable[[], Run]], repetitions: int, log: Callable[[str], None]) -> dict:
    """Run the sides in alternating order `repetitions` times; per-side runs, in order."""
    names = list(sides)
    runs: dict[str, list[Run]] = {n: [] for n in names}
    for rep in range(repetitions):
        for name in names if rep % 2 == 0 else list(reversed(names)):
            run = CPU.measure(sides[name])
            runs[name].append(run)
            log(f"    rep {rep + 1}/{repetitions} {name}: {run.per_second:8.1f}/s, "
                f"{run.per_cpu_second or 0:6.1f} per CPU-second")
    return runs


def ratio_summary(numerator: list[Run], denominator: list[Run], target: float | None) -> dict:
    ratios = [a.per_second / b.per_second for a, b in zip(numerator, denominator)]
    median = statistics.median(ratios)
    cpu = [a.per_cpu_second / b.per_cpu_second for a, b in zip(numerator, denominator)
           if a.per_cpu_second and b.per_cpu_second]
    return {"median": median, "ratios": ratios, "target": target,
            "met": None if target is None else median >= target,
            "per_cpu_second_median": statistics.median(cpu) if cpu else None, "per_cpu_second_ratios": cpu}


def side_summary(runs: list[Run], unit: str = "sentences/s") -> dict:
    latencies = [x for r in runs for x in r.latencies_ms]
    return {
        "throughput_median": statistics.median(r.per_second for r in runs),
        "throughput_runs": [r.per_second for r in runs],
        "per_cpu_second_median": statistics.median(r.per_cpu_second or 0 for r in runs),
        "unit": unit,
        "latency_p50_ms": percentile(latencies, 50),
        "latency_p99_ms": percentile(latencies, 99),
    }


# ---------------------------------------------------------------------------------------------- sides


def _load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class SentenceTransformersSide:
    """What a user runs without a server: `SentenceTransformer.encode` with its own batching."""

    def __init__(self, model_path: Path, batch_size: int, threads: int = 0):
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(model_path), device="cpu")
        self.batch_size = batch_size
        self.threads = threads  # 0: torch's default (one per core), what a user gets

    def embed(self, sentences: list[str]) -> np.ndarray:
        import torch

        default = torch.get_num_threads()
        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            return self.model.encode(sentences, batch_size=self.batch_size, convert_to_numpy=True)
        finally:
            torch.set_num_threads(default)

    def run(self, sentences: list[str]) -> Run:
        start = time.perf_counter()
        self.embed(sentences)
        return Run(len(sentences), time.perf_counter() - start)


def replace_threads(side: SentenceTransformersSide, threads: int) -> SentenceTransformersSide:
    """The same loaded model, run with another torch thread count."""
    other = object.__new__(SentenceTransformersSide)
    other.model, other.batch_size, other.threads = side.model, side.batch_size, threads
    return other


class BareEncoderSide:
    """The served encoder without Triton: the repository's own encoder file, runtime, precision and session
    options, run through the same runner code (packing or length grouping) in-process, plus tokenization and
    pooling (unless the encoder pools). The ratio served ÷ this is what serving costs."""

    def __init__(self, repository: Path, model: str):
        from google.protobuf.json_format import MessageToDict
        from tokenizers import Tokenizer

        from tritonpack.spec import parse_config

        encoder_dir = repository / f"{model}_encoder"
        config = parse_config((encoder_dir / "config.pbtxt").read_text())
        params = {k: v.string_value for k, v in config.parameters.items()}
        tokenizer_cfg = parse_config((repository / f"{model}_tokenizer" / "config.pbtxt").read_text())
        tok_params = {k: v.string_value for k, v in tokenizer_cfg.parameters.items()}
        self.runtime = f"{params['framework']} {params.get('precision', 'fp32')}" + \
            (f", packed ≤ {params['max_pack_tokens']} tokens" if "max_pack_tokens" in params else "")
        runner_dir = MODELS_DIR / "framework_runner"
        sys.path[:0] = [str(runner_dir), str(MODELS_DIR / "shared")]  # the runner imports its siblings
        try:
            runner = _load_module(runner_dir / "runner_batching.py", "tritonpack_bench_runner_batching")
            session = _load_module(runner_dir / f"{params['framework']}_session.py",
                                   f"tritonpack_bench_{params['framework']}_session")
        finally:
            del sys.path[:2]

        class InProcessRunner(runner.FrameworkRunnerModel):
            def open_session(self, path, params):
                return session.open_session(path, params)

        self.runner = InProcessRunner()
        self.runner.initialize({"model_config": json.dumps(MessageToDict(config, preserving_proto_field_name=True)),
                                "model_repository": str(encoder_dir), "model_version": "1"})
        self.pool = _load_module(MODELS_DIR / "mean_pooling" / "pooling.py", "tritonpack_bench_pooling").mean_pool
        self.tokenizer = Tokenizer.from_file(str(repository / f"{model}_tokenizer" / "1" / "tokenizer.json"))
        pad_id = self.tokenizer.token_to_id(tok_params["pad_token"])
        self.tokenizer.enable_truncation(int(tok_params["max_sequence_length"]))
        self.tokenizer.enable_padding(pad_id=pad_id, pad_token=tok_params["pad_token"])

    def embed(self, sentences: list[str]) -> np.ndarray:
        encodings = self.tokenizer.encode_batch(sentences)
        item = {"input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
                "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
                "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64)}
        item = {n: item[n] for n in self.runner.input_names}
        result = self.runner._run([item])[0]
        if "EMBEDDING" in result:  # the encoder pools itself
            return result["EMBEDDING"]
        return self.pool(result["token_embeddings"], item["attention_mask"], True)

    def run(self, batches: list[list[str]]) -> Run:
        latencies = []
        start = time.perf_counter()
        for batch in batches:
            t = time.perf_counter()
            self.embed(batch)
            latencies.append(1000 * (time.perf_counter() - t))
        return Run(sum(len(b) for b in batches), time.perf_counter() - start, latencies)


class ServedClient:
    """One tritonclient (HTTP or gRPC) per thread, as a multi-threaded user would hold them."""

    def __init__(self, server, model: str, protocol: str):
        self.model, self.protocol = model, protocol
        if protocol == "grpc":
            import tritonclient.grpc as client_module

            self.url = f"127.0.0.1:{server.grpc_port}"
        else:
            import tritonclient.http as client_module

            self.url = server.url
        self.module = client_module
        self.client = client_module.InferenceServerClient(self.url)
        self.outputs = [client_module.InferRequestedOutput("EMBEDDING")]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        values = np.array([[t.encode()] for t in texts], dtype=object)
        tensor = self.module.InferInput("TEXT", list(values.shape), "BYTES")
        tensor.set_data_from_numpy(values)
        return self.client.infer(self.model, [tensor], outputs=self.outputs).as_numpy("EMBEDDING")

    def close(self) -> None:
        self.client.close()


class ServedSide:
    """`concurrency` threads send the requests (lists of sentences) to a served text ensemble.

    Worker threads persist across runs and each owns its client (the HTTP client is gevent-based and must stay
    on the thread that made it), so connection set-up is not timed.
    """

    def __init__(self, server, model: str, protocol: str):
        self.server, self.model, self.protocol = server, model, protocol
        self._workers: list[tuple[threading.Thread, queue.Queue]] = []

    client_class = ServedClient

    def _worker(self, tasks: queue.Queue) -> None:
        client = self.client_class(self.server, self.model, self.protocol)
        try:
            while (task := tasks.get()) is not None:
                task(client)
        finally:
            client.close()

    def embed_all(self, requests: list[list[str]], concurrency: int = 1) -> tuple[Run, list[np.ndarray]]:
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

        def work(client: ServedClient) -> None:
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

    def run(self, requests: list[list[str]], concurrency: int) -> Run:
        return self.embed_all(requests, concurrency)[0]

    def close(self) -> None:
        for _, tasks in self._workers:
            tasks.put(None)
        for thread, _ in self._workers:
            thread.join(timeout=10)
        self._workers.clear()


def cosine_min(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((a * b).sum(axis=1).min())


# ---------------------------------------------------------------------------------------------- experiments


class Bench:
    """One `tritonpack bench` run: builds what it serves, measures P1–P6, writes the report."""

    def __init__(self, settings: BenchSettings, log: Callable[[str], None] | None = None):
        self.settings = settings
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self.out = Path(settings.out)
        self.sentences = corpus(settings.sentences, settings.seed)
        self.results: dict = {}
        self.servers: list = []

    # ---- building and serving -----------------------------------------------------------------------------
    def build_variant(self, label: str, name: str = "bert", serving: tuple[tuple[str, str], ...] = ()):
        """Build `name` (portable) into dist/bench/repos/<label>/, sharing the export cache with `make build`."""
        from tritonpack.builder import BuildRequest, build

        dist = self.out / "repos" / label
        dist.mkdir(parents=True, exist_ok=True)
        cache = Path(self.settings.dist).resolve() / "cache"
        cache.mkdir(parents=True, exist_ok=True)
        link = dist / "cache"
        if not link.exists():
            link.symlink_to(cache, target_is_directory=True)
        start = time.perf_counter()
        result = build(BuildRequest(name, "portable", dist=dist, **({"serving": serving} if serving else {})))
        self.log(f"  built {label}: {result.repository} in {time.perf_counter() - start:.1f}s")
        return result

    def serve(self, repository: Path):
        from tritonpack.server import TritonServer

        server = TritonServer(repository, log_path=self.out / "logs" / f"{repository.parent.name}.log")
        self.servers.append(server)
        server.start()
        CPU.groups.append(server.process.pid)  # the server is its process group's leader (start_new_session)
        return server

    def stop_servers(self) -> None:
        while self.servers:
            self.stop_server(self.servers[-1])

    def stop_server(self, server) -> None:
        with contextlib.suppress(ValueError):
            CPU.groups.remove(server.process.pid)
        self.servers.remove(server)
        server.stop()

    # ---- P1, P2, P3 -----------------------------------------------------------------------------------------
    def text(self) -> None:
        s = self.settings
        from tritonpack.build.text_source import SentenceTransformerSource

        source = SentenceTransformerSource.resolve(None)
        default = self.build_variant("default")
        unbatched = self.build_variant("no-dynamic-batching", serving=(("dynamic_batching", "false"),))
        served_repo = default.repository
        self.results["settings_served"] = {
            "repository": str(served_repo),
            "configs": {p.parent.name: p.read_text() for p in sorted(served_repo.glob("*/config.pbtxt"))},
        }
        st = SentenceTransformersSide(source.path, s.st_batch_size)
        bare_side = BareEncoderSide(served_repo, "bert")
        self.results["settings_served"]["bare_encoder"] = bare_side.runtime
        server = self.serve(served_repo)
        served = ServedSide(server, "bert", s.protocol)
        singles = [[t] for t in self.sentences]
        try:
            # warm every side once (first calls allocate arenas, compile kernels, open connections)
            reference = st.embed(self.sentences)
            bare_side.embed(self.sentences[:32])
            run, vectors = served.embed_all(singles, max(s.concurrencies))
            cos = cosine_min(np.concatenate(vectors), reference)
            cos_bare = cosine_min(bare_side.embed(self.sentences), reference)
            self.log(f"  min cosine to sentence-transformers: served {cos:.6f}, bare {cos_bare:.6f}")

            self.log("P1 served bert (one sentence per request) ÷ in-process sentence-transformers")
            # torch's default (2 threads here) is the headline; one thread shows how much of the gap is torch's
            # intra-op threads waiting on each other while other processes hold the cores
            st1 = replace_threads(st, 1)
            sides = {"sentence-transformers": lambda: st.run(self.sentences),
                     "sentence-transformers 1 thread": lambda: st1.run(self.sentences)}
            for c in s.concurrencies:
                sides[f"served c={c}"] = lambda c=c: served.run(singles, c)
            runs = alternate(sides, s.repetitions, self.log)
            p1 = {"cosine_min_vs_sentence_transformers": cos, "cosine_target": 0.9999,
                  "sentence_transformers": side_summary(runs["sentence-transformers"]),
                  "sentence_transformers_1_thread": side_summary(runs["sentence-transformers 1 thread"]),
                  "st_batch_size": s.st_batch_size, "protocol": s.protocol, "by_concurrency": {}}
            for c in s.concurrencies:
                p1["by_concurrency"][str(c)] = {
                    "served": side_summary(runs[f"served c={c}"]),
                    "ratio": ratio_summary(runs[f"served c={c}"], runs["sentence-transformers"],
                                           TARGETS["P1_c8"] if c == 8 else None),
                    "ratio_vs_1_thread": ratio_summary(runs[f"served c={c}"],
                                                       runs["sentence-transformers 1 thread"], None),
                }
            self.results["P1"] = p1

            self.log("client protocol at c=8: gRPC ÷ HTTP")
            other = "http" if s.protocol == "grpc" else "grpc"
            served_other = ServedSide(server, "bert", other)
            try:
                runs = alternate({s.protocol: lambda: served.run(singles, 8),
                                  other: lambda: served_other.run(singles, 8)}, s.repetitions, self.log)
            finally:
                served_other.close()
            grpc_runs, http_runs = (runs["grpc"], runs["http"])
            self.results["client_protocol"] = {
                "grpc": side_summary(grpc_runs), "http": side_summary(http_runs),
                "grpc_over_http": ratio_summary(grpc_runs, http_runs, None),
            }

            self.log(f"P2 served bert ÷ bare {bare_side.runtime} in-process ({s.request_batch} sentences per request)")
            chunks = [self.sentences[i:i + s.request_batch] for i in range(0, len(self.sentences), s.request_batch)]
            p2 = {}
            for c in (1, 2):
                runs = alternate({"bare": lambda: bare_side.run(chunks),
                                  f"served c={c}": lambda c=c: served.run(chunks, c)}, s.repetitions, self.log)
                p2[f"batch{s.request_batch}_c{c}"] = {
                    "served": side_summary(runs[f"served c={c}"]), "bare": side_summary(runs["bare"]),
                    "ratio": ratio_summary(runs[f"served c={c}"], runs["bare"],
                                           TARGETS["P2_batch32"] if c == 1 else None),
                }
            self.log(f"P2 single-sentence requests at c=4 ÷ bare {bare_side.runtime} one sentence per call")
            runs = alternate({"bare": lambda: bare_side.run(singles),
                              "served c=4": lambda: served.run(singles, 4)}, s.repetitions, self.log)
            p2["single_c4"] = {"served": side_summary(runs["served c=4"]),
                               "bare": side_summary(runs["bare"]),
                               "ratio": ratio_summary(runs["served c=4"], runs["bare"],
                                                      TARGETS["P2_single_c4"])}
            self.results["P2"] = p2

            self.log("P3 dynamic batching on ÷ off, one sentence per request at c=8")
            server_off = self.serve(unbatched.repository)
            served_off = ServedSide(server_off, "bert", s.protocol)
            try:
                served_off.run(singles[:32], 8)
                runs = alternate({"batching on": lambda: served.run(singles, 8),
                                  "batching off": lambda: served_off.run(singles, 8)}, s.repetitions, self.log)
            finally:
                served_off.close()
                self.stop_server(server_off)
            self.results["P3"] = {"on": side_summary(runs["batching on"]), "off": side_summary(runs["batching off"]),
                                  "ratio": ratio_summary(runs["batching on"], runs["batching off"],
                                                         TARGETS["P3_c8"])}
        finally:
            served.close()
            self.stop_servers()
        self.results["tarballs"] = {"bert-portable": str(default.tarball)}

    # ---- P4 -------------------------------------------------------------------------------------------------
    def cold_start(self) -> None:
        """Tarball on disk → first answer through the local MME gateway (Triton's SageMaker front-end)."""
        import tempfile
        import urllib.request

        tarball = Path(self.results.get("tarballs", {}).get("bert-portable", ""))
        if not tarball.is_file():
            tarball = self.build_variant("default").tarball
        try:
            from tritonpack.mme import LocalMME
        except ImportError as e:
            self.results["P4"] = {"available": False, "reason": f"tritonpack.mme is not importable: {e}"}
            return
        body = json.dumps({"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES",
                                       "data": ["cold start probe"]}]}).encode()
        runs = []
        for rep in range(min(3, self.settings.repetitions)):
            with tempfile.TemporaryDirectory(prefix="tritonpack-bench-mme-") as cache:
                mme = LocalMME(str(tarball.parent), port=0, cache_dir=Path(cache),
                               triton_log=self.out / "logs" / f"mme-{rep}.log")
                server_start = time.perf_counter()
                with mme:
                    started = time.perf_counter()
                    times = []
                    for _ in range(2):  # cold, then warm
                        request = urllib.request.Request(
                            f"{mme.url}/endpoints/bench/invocations", data=body, method="POST",
                            headers={"Content-Type": "application/json", "X-Amzn-SageMaker-Target-Model": tarball.name})
                        t = time.perf_counter()
                        with urllib.request.urlopen(request, timeout=120) as response:
                            json.loads(response.read())
                        times.append(time.perf_counter() - t)
                    runs.append({"server_start_s": started - server_start, "first_response_s": times[0],
                                 "warm_response_s": times[1]})
                    self.log(f"    rep {rep + 1}: tarball → first response {times[0]:.2f}s "
                             f"(server start {started - server_start:.1f}s, warm {1000 * times[1]:.0f} ms)")
        first = statistics.median(r["first_response_s"] for r in runs)
        self.results["P4"] = {
            "available": True, "via": "tritonpack.mme.LocalMME (gateway → Triton SageMaker front-end 2.51)",
            "tarball": str(tarball), "first_response_s_median": first, "fraction_of_60s": first / SLA_SECONDS,
            "target_s": COLD_START_TARGET_S, "met": first <= COLD_START_TARGET_S, "runs": runs,
        }

    # ---- P5 -------------------------------------------------------------------------------------------------
    def image(self) -> None:
        try:
            from tritonpack import bench_image
        except ImportError:
            bench_image = None
        if bench_image is None or importlib.util.find_spec("ensembles.resnet_pt") is None:
            self.results["P5"] = {"available": False,
                                  "reason": "ensembles/resnet_pt.py or its bench is not available in this tree"}
            return
        try:
            self.results["P5"] = bench_image.measure(self)
        except Exception as e:  # noqa: BLE001 - one experiment failing must not lose the others
            self.results["P5"] = {"available": False, "reason": f"{type(e).__name__}: {e}"}

    # ---- P6 -------------------------------------------------------------------------------------------------
    def sizes(self) -> None:
        dist = Path(self.settings.dist)
        tarballs = {p.name: p.stat().st_size for p in sorted(dist.glob("*.tar.gz"))}
        for label in sorted((self.out / "repos").glob("*")):
            for p in label.glob("*.tar.gz"):
                tarballs[f"bench/{label.name}/{p.name}"] = p.stat().st_size
        envs = {}
        if (dist / "envs").is_dir():
            for p in sorted((dist / "envs").rglob("*")):
                if p.is_file() and p.name.endswith((".tar.gz", ".tgz", ".tar")):
                    envs[str(p.relative_to(dist / "envs"))] = p.stat().st_size
        text_envs = {k: v for k, v in envs.items() if "text" in k}
        self.results["P6"] = {
            "tarballs_bytes": tarballs, "envs_bytes": envs,
            "envs_note": None if envs else "dist/envs/ has no packed environments (run `make env`)",
            "text_env_target_mb": TEXT_ENV_TARGET_MB,
            "text_env_met": (max(text_envs.values()) / 2**20 <= TEXT_ENV_TARGET_MB) if text_envs else None,
        }

    # ---- the whole run --------------------------------------------------------------------------------------
    def run(self) -> dict:
        self.out.mkdir(parents=True, exist_ok=True)
        started = time.time()
        busy = other_processes()
        report = {"schema": 1, "mode": self.settings.mode, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  "machine": machine(), "versions": versions(),
                  "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self.settings).items()},
                  "corpus": corpus_stats(self.sentences), "other_processes_at_start": busy}
        with LoadMonitor() as load:
            try:
                self.text()
                self.cold_start()
                self.image()
                self.sizes()
            finally:
                self.stop_servers()
        report.update(self.results)
        report["load"] = load.summary()
        report["other_processes_at_end"] = other_processes()
        report["duration_s"] = time.time() - started
        report["summary"] = summary_rows(report)
        write_report(report, self.out)
        return report


def corpus_stats(sentences: list[str]) -> dict:
    words = [len(s.split()) for s in sentences]
    return {"sentences": len(sentences), "words_min": min(words), "words_median": statistics.median(words),
            "words_max": max(words), "example": sentences[:3]}


# ---------------------------------------------------------------------------------------------- report


def summary_rows(report: dict) -> list[dict]:
    """One row per headline number: what, measured, target, met."""
    rows = []

    def ratio(key: str, what: str, value: dict | None) -> None:
        if value:
            rows.append({"key": key, "what": what, "value": value["median"], "unit": "×",
                         "target": value.get("target"), "met": value.get("met"),
                         "per_cpu_second": value.get("per_cpu_second_median")})

    p1 = report.get("P1", {})
    for c, entry in p1.get("by_concurrency", {}).items():
        ratio(f"P1_c{c}", f"served bert ÷ sentence-transformers, 1 sentence/request, c={c}", entry["ratio"])
    if "8" in p1.get("by_concurrency", {}):
        ratio("P1_c8_vs_st_1thread", "served bert ÷ sentence-transformers with torch on 1 thread, c=8",
              p1["by_concurrency"]["8"].get("ratio_vs_1_thread"))
    if "cosine_min_vs_sentence_transformers" in p1:
        cos = p1["cosine_min_vs_sentence_transformers"]
        rows.append({"key": "P1_cosine", "what": "min cosine served vs sentence-transformers", "value": cos,
                     "unit": "", "target": 0.9999, "met": cos >= 0.9999})
    bare = report.get("settings_served", {}).get("bare_encoder", "onnxruntime fp32")
    for key, entry in report.get("P2", {}).items():
        ratio(f"P2_{key}", f"served bert ÷ bare encoder in-process ({bare}), {key.replace('_', ' ')}", entry["ratio"])
    if "P3" in report:
        ratio("P3_c8", "dynamic batching on ÷ off, c=8", report["P3"]["ratio"])
    p4 = report.get("P4", {})
    if p4.get("available"):
        rows.append({"key": "P4_cold_start", "what": "MME tarball on disk → first response (s)",
                     "value": p4["first_response_s_median"], "unit": "s", "target": p4["target_s"],
                     "met": p4["met"], "note": f"{100 * p4['fraction_of_60s']:.1f}% of SageMaker's 60 s"})
    p5 = report.get("P5", {})
    if p5.get("available"):
        ratio("P5_served_vs_direct", "served resnet_pt ÷ DALI + torch in-process", p5.get("served_vs_direct"))
        ratio("P5_dali_vs_pil", "DALI CPU preprocessing ÷ PIL/numpy", p5.get("dali_vs_pil"))
    p6 = report.get("P6", {})
    text_envs = {k: v for k, v in p6.get("envs_bytes", {}).items() if "text" in k}
    if text_envs:
        name, size = max(text_envs.items(), key=lambda kv: kv[1])
        rows.append({"key": "P6_text_env", "what": f"text env {name} compressed (MB)", "value": size / 2**20,
                     "unit": "MB", "target": p6["text_env_target_mb"], "met": p6["text_env_met"]})
    return rows


def _fmt(value, unit: str = "") -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.6f}" if unit == "" and value < 1.5 else f"{value:.2f}"  # a cosine, or a ratio
    return str(value)


def _latency_table(report: dict) -> list[str]:
    p1 = report.get("P1")
    if not p1:
        return []
    lines = ["| concurrency | served sentences/s (median) | p50 ms | p99 ms | ÷ sentence-transformers | "
             "per CPU-second |", "|---:|---:|---:|---:|---:|---:|"]
    for c, entry in p1["by_concurrency"].items():
        s = entry["served"]
        lines.append(f"| {c} | {s['throughput_median']:.1f} | {_fmt(s['latency_p50_ms'], 'ms')} | "
                     f"{_fmt(s['latency_p99_ms'], 'ms')} | {entry['ratio']['median']:.2f} | "
                     f"{entry['ratio'].get('per_cpu_second_median') or 0:.2f} |")
    st = p1["sentence_transformers"]
    lines.append(f"\nsentence-transformers in-process (batch {p1['st_batch_size']}): "
                 f"{st['throughput_median']:.1f} sentences/s (median of {len(st['throughput_runs'])}), "
                 f"{st['per_cpu_second_median']:.1f} per CPU-second.")
    st1 = p1.get("sentence_transformers_1_thread")
    if st1:
        lines.append(f"With torch on one thread: {st1['throughput_median']:.1f} sentences/s, "
                     f"{st1['per_cpu_second_median']:.1f} per CPU-second.")
    return lines


def render_markdown(report: dict) -> str:
    m, load = report["machine"], report.get("load", {})
    lines = [
        "# tritonpack bench report", "",
        f"Mode **{report['mode']}**, started {report['started']}, took {report.get('duration_s', 0):.0f} s. "
        "Each ratio alternates its two sides in one run; the median of the per-repetition ratios is shown.", "",
        f"Machine: {m['cores']} cores, {m['cpu_model']}, {m['memory_gb']} GB, {m['platform']}, "
        f"Python {m['python']}.",
        f"Load average (1 min) during the run: min {load.get('load1_min', 0):.1f}, "
        f"median {load.get('load1_median', 0):.1f}, max {load.get('load1_max', 0):.1f} "
        f"on {m['cores']} cores" + (" — other processes were competing for the CPU, so absolute throughputs are "
                                    "low and noisy; the ratios are what this report is for."
                                    # the bench alone keeps every core busy (load ≈ cores)
                                    if load.get("load1_median", 0) > (m["cores"] or 1) + 1 else "."), "",
        "## Results", "",
        "Ratios are wall-clock throughput ratios (the targets apply to them); *per CPU-second* divides each "
        "side's items by the CPU time it used (this process plus the servers it started), which other processes' "
        "load does not bias.", "",
        "| | measured | per CPU-second | target | met |", "|---|---:|---:|---:|:---:|",
    ]
    for row in report["summary"]:
        met = "–" if row["met"] is None else ("yes" if row["met"] else "**no**")
        target = "–" if row["target"] is None else (f"≤ {row['target']}" if row["unit"] in ("s", "MB")
                                                    else f"≥ {row['target']}")
        note = f" ({row['note']})" if row.get("note") else ""
        cpu = f"{row['per_cpu_second']:.2f}×" if row.get("per_cpu_second") else "–"
        lines.append(f"| {row['key']}: {row['what']}{note} | {_fmt(row['value'], row['unit'])}{row['unit']} | "
                     f"{cpu} | {target} | {met} |")
    lines += ["", "## P1 latency and throughput by concurrency", ""] + _latency_table(report)
    cp = report.get("client_protocol")
    if cp:
        lines += ["", f"Client protocol at c=8: gRPC {cp['grpc']['throughput_median']:.1f}/s, HTTP "
                      f"{cp['http']['throughput_median']:.1f}/s (gRPC ÷ HTTP {cp['grpc_over_http']['median']:.2f})."]
    for key in ("P4", "P5"):
        if key in report and not report[key].get("available"):
            lines += ["", f"{key}: not available — {report[key]['reason']}"]
    p6 = report.get("P6")
    if p6:
        lines += ["", "## P6 sizes", "", "| file | MB |", "|---|---:|"]
        for name, size in {**p6["tarballs_bytes"], **{f"envs/{k}": v for k, v in p6["envs_bytes"].items()}}.items():
            lines.append(f"| {name} | {size / 2**20:.1f} |")
        if p6.get("envs_note"):
            lines.append(f"\n{p6['envs_note']}.")
    lines += ["", "## Versions", "", ", ".join(f"{k} {v}" for k, v in report["versions"].items()), "",
              "## Settings", "", "```json", json.dumps(report["settings"], indent=1), "```"]
    busy = report.get("other_processes_at_start", []) + report.get("other_processes_at_end", [])
    if busy:
        lines += ["", "Busiest other processes (start, end):", ""]
        lines += [f"- {b['cpu_percent']}% `{b['command'][:100]}`" for b in busy]
    lines += ["", "Plots: " + ", ".join(f"![{p}]({p})" for p in report.get("plots", []))]
    return "\n".join(lines) + "\n"


def write_plots(report: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    p1 = report.get("P1")
    if p1:
        cs = [int(c) for c in p1["by_concurrency"]]
        entries = list(p1["by_concurrency"].values())
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(cs, [e["served"]["throughput_median"] for e in entries], "o-", label="served bert (1 sentence/req)")
        ax.axhline(p1["sentence_transformers"]["throughput_median"], color="gray", ls="--",
                   label=f"sentence-transformers in-process (batch {p1['st_batch_size']})")
        ax.set(xlabel="concurrency", ylabel="sentences/s", title="P1 throughput", xscale="log", xticks=cs)
        ax.set_xticklabels([str(c) for c in cs])
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "p1_throughput.png", dpi=100)
        plt.close(fig)
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(cs, [e["served"]["latency_p50_ms"] for e in entries], "o-", label="p50")
        ax.plot(cs, [e["served"]["latency_p99_ms"] for e in entries], "s-", label="p99")
        ax.set(xlabel="concurrency", ylabel="ms per request", title="P1 latency (served bert)", xscale="log",
               xticks=cs)
        ax.set_xticklabels([str(c) for c in cs])
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "p1_latency.png", dpi=100)
        plt.close(fig)
        written += ["p1_throughput.png", "p1_latency.png"]
    rows = [r for r in report["summary"] if r["unit"] == "×"]
    if rows:
        fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.2))
        y = range(len(rows))
        ax.barh(list(y), [r["value"] for r in rows],
                color=["tab:green" if r["met"] else "tab:red" if r["met"] is False else "tab:blue" for r in rows])
        for i, r in enumerate(rows):
            if r["target"] is not None:
                ax.plot([r["target"]] * 2, [i - 0.4, i + 0.4], "k-", lw=2)
        ax.set_yticks(list(y))
        ax.set_yticklabels([r["key"] for r in rows])
        ax.invert_yaxis()
        ax.set(xlabel="ratio (median; black bar: target)", title="tritonpack bench ratios")
        fig.tight_layout()
        fig.savefig(out / "ratios.png", dpi=100)
        plt.close(fig)
        written.append("ratios.png")
    return written


def write_report(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    report["plots"] = write_plots(report, out)
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out / "report.md").write_text(render_markdown(report))


# ---------------------------------------------------------------------------------------------- command line


def cmd_bench(args) -> int:
    import signal

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # SIGTERM (and SIGINT where a background shell ignores it) end the run through its cleanup: servers stop.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    settings = BenchSettings.for_mode(
        args.mode, repetitions=args.repetitions, sentences=args.sentences, protocol=args.protocol,
        out=Path(args.out), dist=Path(args.dist),
        concurrencies=tuple(int(c) for c in args.concurrency.split(",")) if args.concurrency else None,
    )
    report = Bench(settings).run()
    for row in report["summary"]:
        met = "" if row["met"] is None else ("  (target met)" if row["met"] else "  (target NOT met)")
        print(f"{row['key']:24s} {_fmt(row['value'], row['unit'])}{row['unit']}{met}")
    print(f"report: {settings.out / 'report.md'}")
    return 0


def add_command(subparsers) -> None:
    p = subparsers.add_parser("bench", help="measure served ensembles against in-process baselines (issue 5)",
                              description=__doc__, formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=("full", "smoke"), default=os.environ.get("BENCH", "full") or "full",
                   help="smoke: small corpus, one repetition (CI); default from $BENCH, else full")
    p.add_argument("--repetitions", type=int, help="alternations per ratio (full: 5, smoke: 1)")
    p.add_argument("--sentences", type=int, help="corpus size (full: 384, smoke: 48)")
    p.add_argument("--concurrency", help="P1 concurrencies, comma-separated (full: 1,4,8,16)")
    p.add_argument("--protocol", choices=("grpc", "http"), help="served client (default http)")
    p.add_argument("--out", default="dist/bench")
    p.add_argument("--dist", default="dist", help="where `make build` puts tarballs and envs (for P6)")
    p.set_defaults(func=cmd_bench)
