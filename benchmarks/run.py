"""One bench run: settings, building and serving what it measures, the experiments in order, the report."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from benchmarks import cold_memory, corpus, images, report, text_peers, text_serving
from benchmarks.meters import CPU, LoadMonitor, busiest_processes, cpu_throughput, machine, versions


@dataclass(frozen=True)
class BenchSettings:
    mode: str = "full"  # full | smoke
    # The timed corpus. sentence-transformers sorts one encode call by length before batching it: with 128
    # sentences its two batches of 64 were padded to their longest members, which halved its throughput and
    # doubled our ratio (docs/performance.md, fourth round). 512 gives it eight batches, its best case here.
    sentences: int = 512
    held_out: int = 512  # cosine checks: distinct sentences none of the sides is timed on (an eighth beyond 256 tokens)
    # alternations of every comparison: one run's throughput here varies by ±15 % within minutes (docs/performance.md,
    # fifty-first round), and a goal's verdict is the median of its per-repetition ratios
    repetitions: int = 5
    concurrencies: tuple[int, ...] = (1, 4, 8, 16, 32)  # served sides
    bucket_concurrency: int = 8  # served sides, by length bucket
    peer_batch_size: int = 64  # in-process sentence-transformers and infinity-emb's batch
    st_variants: bool = True  # also sentence-transformers torch at its default batch 32, and on one thread
    peers: str = "all"  # all: make missing peer venvs | cached: only peers whose venv exists | none
    # infinity-emb's engines (peers.INFINITY_ENGINES) tried; the fastest at c=8 that holds the cosine floor is compared
    infinity_engines: tuple[str, ...] = ("optimum", "optimum-openvino", "torch", "torch-bf16")
    request_batch: int = 32  # sentences per request for served ÷ same encoder in-process
    loaded_copies: tuple[int, ...] = (1, 4, 8)  # bert tarballs loaded at once through the local MME
    requests_per_step: int = 300  # after each loading step, spread over the loaded copies
    cold_starts: int = 3
    dynamic_batching: bool = True  # batching on ÷ off (builds a second repository)
    images: bool = True  # served resnet_pt ÷ in-process, DALI ÷ PIL (builds resnet_pt)
    without_env: bool = True  # memory and cold start also for the tarball built with --no-env
    seed: int = 5
    out: Path = Path("dist/bench")
    dist: Path = Path("dist")

    @classmethod
    def for_mode(cls, mode: str, **overrides) -> BenchSettings:
        if mode == "smoke":
            base = cls(mode="smoke", sentences=48, held_out=16, repetitions=1, concurrencies=(1, 8),
                       st_variants=False, peers="none", infinity_engines=("optimum",), loaded_copies=(1, 2),
                       requests_per_step=20, cold_starts=1, dynamic_batching=False, images=False,
                       without_env=False)
        elif mode == "full":
            base = cls()
        else:
            raise ValueError(f"unknown bench mode {mode!r}; full or smoke")
        return replace(base, **{k: v for k, v in overrides.items() if v is not None})


class Bench:
    def __init__(self, settings: BenchSettings, log: Callable[[str], None] | None = None):
        self.settings = settings
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self.out = Path(settings.out)
        self.peers_root = Path(settings.dist).resolve() / "bench" / "peers"
        self.servers: list = []
        self.served_repository: Path | None = None

    def container_python(self) -> str | None:
        """The default container's Python where this machine runs its stub (`containers.ContainerPython`): the
        MME part then measures the default tarball as users upload it, its environment run by that stub. Else None,
        and the tarball's environment is packed for this interpreter's Python, which the local stub runs."""
        from tritonpack.containers import ContainerPython
        from tritonpack.errors import UserError

        try:
            return ContainerPython.of_default_container().version
        except UserError as e:
            self.log(f"  the MME part runs the tarball's environment for this interpreter's Python instead: {e}")
            return None

    def build_variant(self, label: str, name: str = "bert", serving: tuple[tuple[str, str], ...] = (),
                      env: bool = True, env_python: str | None = None):
        """Build `name` (portable) into <out>/repos/<label>/, sharing the export cache with `make build`; its
        tarball's environment for `env_python`, by default the local stub's."""
        from tritonpack.builder import BuildRequest, build
        from tritonpack.server import PYTHON_VERSION

        dist = self.out / "repos" / label
        dist.mkdir(parents=True, exist_ok=True)
        cache = Path(self.settings.dist).resolve() / "cache"
        cache.mkdir(parents=True, exist_ok=True)
        link = dist / "cache"
        if not link.exists():
            link.symlink_to(cache, target_is_directory=True)
        start = time.perf_counter()
        result = build(BuildRequest(name, "portable", dist=dist, env=env, env_python=env_python or PYTHON_VERSION,
                                    **({"serving": serving} if serving else {})))
        self.log(f"  built {label}: {result.repository} in {time.perf_counter() - start:.1f}s")
        return result

    def serve(self, repository: Path):
        from tritonpack.server import TritonServer

        log = self.out / "logs" / f"{repository.parent.name}.log"
        log.unlink(missing_ok=True)  # the server's own: what its encoder computes is read from it
        server = TritonServer(repository, log_path=log)
        self.servers.append(server)
        server.start()
        CPU.watch(server.process.pid)  # the server leads its own process group (start_new_session)
        return server

    def stop_server(self, server) -> None:
        CPU.forget(server.process.pid)
        self.servers.remove(server)
        server.stop()

    def attempt(self, results: dict, key: str, experiment: Callable[[], dict]) -> None:
        """Run one experiment; one that fails is reported and the others still run."""
        try:
            results[key] = experiment()
        except Exception as e:  # noqa: BLE001 - recorded in the report, with its type and message
            self.log(f"  {key} failed: {type(e).__name__}: {e}")
            results[key] = {"available": False, "reason": f"{type(e).__name__}: {e}"}

    def stop_servers(self) -> None:
        while self.servers:
            self.stop_server(self.servers[-1])

    def experiments(self) -> dict:
        results: dict = {}
        stub_python = self.container_python()
        built = self.build_variant("default", env_python=stub_python)
        self.served_repository = built.repository
        try:
            server = self.serve(built.repository)
            self.attempt(results, "peers", lambda: text_peers.measure(self, server))
            self.attempt(results, "served_over_same_encoder",
                         lambda: text_serving.served_over_same_encoder(self, server))
            if self.settings.dynamic_batching:
                self.attempt(results, "dynamic_batching",
                             lambda: text_serving.dynamic_batching_on_over_off(self, server))
            self.stop_servers()  # memory and cold start are measured with no other server running
            self.attempt(results, "mme", lambda: cold_memory.measure(self, built.tarball, stub_python))
            self.attempt(results, "sizes", lambda: cold_memory.sizes(self, built.tarball))
            if self.settings.without_env:  # for a server whose Python has the packages (environment.yml in the image)
                bare = self.build_variant("no-env", env=False)
                self.attempt(results, "mme_no_env", lambda: cold_memory.measure(self, bare.tarball) |
                             cold_memory.tarball_size(bare.tarball))
            if self.settings.images:
                self.attempt(results, "images", lambda: images.measure(self))
        finally:
            self.stop_servers()
        return results

    def run(self) -> dict:
        self.out.mkdir(parents=True, exist_ok=True)
        started = time.time()
        result = {"schema": 2, "mode": self.settings.mode, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  "machine": machine(), "versions": versions(),
                  "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self.settings).items()},
                  "corpus": corpus.describe(corpus.corpus(self.settings.sentences, self.settings.seed)),
                  "other_processes_at_start": busiest_processes(), "cpu_throughput_at_start": cpu_throughput()}
        with LoadMonitor() as load:
            result.update(self.experiments())
        result["load"] = load.summary()
        result["other_processes_at_end"] = busiest_processes()
        result["cpu_throughput_at_end"] = cpu_throughput()
        result["duration_s"] = time.time() - started
        report.write(result, self.out)
        return result
