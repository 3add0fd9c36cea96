"""Soak a served ensemble: many mixed valid and hostile requests at fixed concurrency, on its own tritonserver.

Measures what the reliability contract promises (README, "Reliability"): no valid request fails or changes its
answer, hostile ones get the answer `tests/reliability/hostile.py` records, server + stub RSS after warm-up stays
flat, and after shutdown no process of the server's group and none of its /dev/shm regions are left.

    python -m tests.reliability.soak dist/bert-portable --requests 10000 --concurrency 8
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from tests.reliability import hostile
from tritonpack import proc
from tritonpack.server import TritonServer

# Memory is sampled this long after the last answer: past the python models' idle heap return (2 s without a call,
# models/shared/resident_memory.IDLE_S). Sampled at once, a sample caught a stub before or after its return at random:
# resnet_pt's were 480-560 or 740-750 MiB on a 2-CPU EPYC, a "trend" of +16 % with no leak.
QUIET_S = 3.0
STATUS_CLASS = {"2xx": range(200, 300), "4xx": range(400, 500), "5xx": range(500, 600)}
WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "triton", "serves",
         "sentence", "embeddings", "on", "two", "small", "cores", "with", "dynamic", "batching", "and", "python",
         "stubs", "talking", "through", "shared", "memory", "naïve", "café", "東京", "🙂")


@dataclass(frozen=True)
class Workload:
    ensemble: str
    valid: list[hostile.RawRequest]
    hostile: list[hostile.HostileCase]
    atol: float = 1e-4  # how far a valid answer under load may be from the same request's answer alone
    min_cosine: float | None = None  # and, per row, at least this cosine to it

    @property
    def path(self) -> str:
        return f"/v2/models/{self.ensemble}/infer"

    def matches(self, got: np.ndarray, expected: np.ndarray) -> bool:
        if got.shape != expected.shape or not np.allclose(got, expected, rtol=1e-4, atol=self.atol):
            return False
        if self.min_cosine is None:
            return True
        rows, reference = got.reshape(len(got), -1), expected.reshape(len(expected), -1)
        cosines = (rows * reference).sum(1) / np.linalg.norm(rows, axis=1) / np.linalg.norm(reference, axis=1)
        return bool(cosines.min() >= self.min_cosine)


@dataclass
class SoakReport:
    ensemble: str
    requests: int = 0
    valid: int = 0
    hostile: int = 0
    valid_failures: list[str] = field(default_factory=list)
    hostile_unexpected: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    rss_kb_after_warmup: int = 0
    rss_kb_end: int = 0
    # where the memory is (tritonpack.proc.Memory per process): the python backend's shared-memory pool counts in
    # both tritonserver's and the stubs' RSS and only grows, so growth there is not a heap leak
    memory_after_warmup: dict[str, dict[str, int]] = field(default_factory=dict)
    memory_end: dict[str, dict[str, int]] = field(default_factory=dict)
    rss_kb_samples: list[int] = field(default_factory=list)  # after each tenth of the run, nothing in flight
    # anonymous and file pages of each process (RssAnon + RssFile: a library mapped by several processes counts in
    # each, a constant) plus the server's /dev/shm regions counted once (summed RSS counts each twice, and more as the
    # pool fills). Not PSS: a page shared with a process outside the group (numpy's, by any other Python of the same
    # environment) is charged partly to that process, so the group's PSS moves when others start or stop (+6.7 % over
    # a bert soak whose RSS grew +2.3 %, while other Pythons came and went)
    unique_kb_after_warmup: int = 0
    unique_kb_end: int = 0
    unique_kb_samples: list[int] = field(default_factory=list)  # after each tenth of the run, as rss_kb_samples
    pss_kb_after_warmup: int = 0  # summed PSS (tritonpack.proc): reported, not bounded
    pss_kb_end: int = 0
    server_regions: list[str] = field(default_factory=list)
    regions_left: list[str] = field(default_factory=list)
    processes_left: list[int] = field(default_factory=list)
    shm_regions_before: int = 0
    shm_regions_after: int = 0
    stop_s: float = 0.0
    log: str = ""  # the server's log; TritonServer keeps it only when something failed

    @property
    def rss_growth(self) -> float:
        return self.rss_kb_end / max(self.rss_kb_after_warmup, 1) - 1.0

    @property
    def unique_growth(self) -> float:
        return self.unique_kb_end / max(self.unique_kb_after_warmup, 1) - 1.0

    @property
    def pss_growth(self) -> float:
        return self.pss_kb_end / max(self.pss_kb_after_warmup, 1) - 1.0

    @property
    def unique_trend(self) -> float:
        """Memory of the run's last third over its first third (means of the samples): what a leak grows, while a
        heap that swings with the last batches' sizes (the TorchScript classifier's, ±40 MB) averages out."""
        third = max(1, len(self.unique_kb_samples) // 3)
        first, last = self.unique_kb_samples[:third], self.unique_kb_samples[-third:]
        return sum(last) / max(sum(first), 1) - 1.0 if first else 0.0

    def summary(self) -> str:
        return (f"{self.ensemble}: {self.requests} requests ({self.hostile} hostile) in {self.duration_s:.0f}s, "
                f"{len(self.valid_failures)} valid failed, {len(self.hostile_unexpected)} hostile unexpected; "
                f"RSS {self.rss_kb_after_warmup / 1024:.0f} → {self.rss_kb_end / 1024:.0f} MiB "
                f"({self.rss_growth:+.1%}; shared memory once {self.unique_growth:+.1%}, "
                f"PSS {self.pss_growth:+.1%}; last third over first {self.unique_trend:+.1%}); "
                f"/dev/shm regions {self.shm_regions_before} before, "
                f"{self.shm_regions_after} after ({len(self.regions_left)} of ours left); "
                f"{len(self.processes_left)} processes left")

    def to_json(self) -> str:
        growth = {"rss_growth": self.rss_growth, "unique_growth": self.unique_growth, "pss_growth": self.pss_growth,
                  "unique_trend": self.unique_trend}
        return json.dumps(asdict(self) | growth, indent=2)


# A bf16 encoder's answer depends slightly on which requests share its pack (measured ≤ 9e-4 on L2-normalised
# embeddings, cosine ≥ 0.99999 to the same request alone); another sentence's embedding is far outside both bounds.
EMBEDDING_ATOL = 2e-3
EMBEDDING_MIN_COSINE = 0.9999


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40)))


def text_workload(ensemble: str, pool: int = 64, seed: int = 0) -> Workload:
    rng = random.Random(seed)
    valid = [hostile.text_request([sentence(rng) for _ in range(rng.choice((1, 1, 2, 4, 8)))]) for _ in range(pool)]
    return Workload(ensemble, valid, hostile.text_cases(), atol=EMBEDDING_ATOL, min_cosine=EMBEDDING_MIN_COSINE)


def image_workload(ensemble: str, pool: int = 16, seed: int = 0) -> Workload:
    rng = random.Random(seed)
    valid = [hostile.image_request(hostile.sample_jpeg((rng.randint(32, 320), rng.randint(32, 320)), seed=i))
             for i in range(pool)]
    return Workload(ensemble, valid, hostile.image_cases(hostile.sample_jpeg()))


def memory(pids) -> dict[str, dict[str, int]]:
    """`name[pid]` → resident memory and its parts in kB (`tritonpack.proc.Memory`)."""
    return {name: asdict(m) for name, m in proc.memory_by_process(pids).items()}


def unique_kb(memory_by_name: dict[str, dict[str, int]], regions) -> int:
    """Anonymous and file pages of every process plus the shared-memory regions' resident pages counted once
    (summed RSS counts a python stub's region twice: in the stub and in tritonserver)."""
    return sum(m["anonymous"] + m["file"] for m in memory_by_name.values()) + proc.shm_resident_kb(regions)


def total(memory_by_name: dict[str, dict[str, int]], figure: str) -> int:
    return sum(m[figure] for m in memory_by_name.values())


def stub_regions(pids) -> set[str]:
    """The /dev/shm region names our python stubs were started with (their command lines name them)."""
    return set().union(*(proc.stub_shm_regions(proc.command_line(pid)) for pid in pids))


def outputs(text: str) -> dict[str, np.ndarray]:
    return {o["name"]: np.asarray(o["data"], dtype=np.float32).reshape(o["shape"])
            for o in json.loads(text)["outputs"]}


class _Runner:
    def __init__(self, server: TritonServer, workload: Workload, concurrency: int):
        import requests

        self.server, self.workload = server, workload
        self.local = threading.local()
        self.session_class = requests.Session
        self.sessions: list = []
        self.pool = ThreadPoolExecutor(concurrency)
        self.expected: list[dict[str, np.ndarray]] = []

    def send(self, request: hostile.RawRequest):
        if not hasattr(self.local, "session"):
            self.local.session = self.session_class()
            self.sessions.append(self.local.session)
        try:
            return hostile.send(self.server.url, self.workload.path, request, session=self.local.session)
        except Exception as e:  # noqa: BLE001 - a connection failure is a failed request, reported
            return 0, f"{type(e).__name__}: {e}"

    def references(self) -> None:
        for request in self.workload.valid:
            status, text = self.send(request)
            if status != 200:
                raise RuntimeError(f"valid request failed before the soak: {status} {text[:300]}")
            self.expected.append(outputs(text))

    def one(self, kind: str, index: int) -> tuple[str, int, str | None]:
        if kind == "hostile":
            case = self.workload.hostile[index]
            status, text = self.send(case.request)
            ok = status in STATUS_CLASS[case.direct]
            return kind, index, None if ok else f"{case.name}: expected {case.direct}, got {status}: {text[:200]}"
        status, text = self.send(self.workload.valid[index])
        if status != 200:
            return kind, index, f"valid #{index}: {status}: {text[:200]}"
        got = outputs(text)
        for name, expected in self.expected[index].items():
            if name not in got or not self.workload.matches(got[name], expected):
                return kind, index, f"valid #{index}: {name} differs from the reference answer"
        return kind, index, None

    def close(self) -> None:
        """Close keep-alive connections: tritonserver waits for open ones before it unloads models."""
        self.pool.shutdown()
        for session in self.sessions:
            session.close()

    def run(self, plan: list[tuple[str, int]]) -> list[tuple[str, int, str | None]]:
        return list(self.pool.map(lambda item: self.one(*item), plan))


def plan_requests(workload: Workload, count: int, hostile_fraction: float, seed: int) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    every = max(1, round(1 / hostile_fraction)) if hostile_fraction > 0 else 0
    plan = []
    for i in range(count):
        if every and i % every == every - 1:
            plan.append(("hostile", (i // every) % len(workload.hostile)))
        else:
            plan.append(("valid", rng.randrange(len(workload.valid))))
    return plan


def soak(repository: Path, workload: Workload, requests: int = 10_000, concurrency: int = 8,
         hostile_fraction: float = 0.1, warmup: int = 1000, seed: int = 0, progress=None,
         quiet_s: float = QUIET_S) -> SoakReport:
    """Serve `repository` its workload's mix and sample the server group's memory after the warm-up, after each
    tenth of the run and at its end, each time `quiet_s` after the last answer (0: at once, for runs that bound no
    memory)."""
    report = SoakReport(workload.ensemble)
    report.shm_regions_before = len(hostile.shm_regions())
    server = TritonServer(Path(repository))
    pgid = None
    try:
        server.start()
        pgid = server.process.pid
        runner = _Runner(server, workload, concurrency)
        try:
            runner.references()
            # warm-up: every hostile case once, then the measured run's own mix at full concurrency, so that the
            # baseline is taken under the traffic it is compared with
            runner.run([("hostile", i) for i in range(len(workload.hostile))])
            runner.run(plan_requests(workload, warmup, hostile_fraction, seed + 1))
            report.server_regions = sorted(stub_regions(server.process_group_pids()))
            time.sleep(quiet_s)
            report.memory_after_warmup = memory(server.process_group_pids())
            report.rss_kb_after_warmup = total(report.memory_after_warmup, "rss")
            report.pss_kb_after_warmup = total(report.memory_after_warmup, "pss")
            report.unique_kb_after_warmup = unique_kb(report.memory_after_warmup, report.server_regions)
            plan = plan_requests(workload, requests, hostile_fraction, seed)
            start = time.monotonic()
            chunk = max(1, requests // 10)
            for begin in range(0, len(plan), chunk):
                for kind, _, problem in runner.run(plan[begin:begin + chunk]):
                    report.requests += 1
                    setattr(report, kind, getattr(report, kind) + 1)
                    if problem:
                        (report.valid_failures if kind == "valid" else report.hostile_unexpected).append(problem)
                time.sleep(quiet_s)
                now = memory(server.process_group_pids())
                report.rss_kb_samples.append(total(now, "rss"))
                report.unique_kb_samples.append(unique_kb(now, report.server_regions))
                if progress:
                    progress(f"{report.requests}/{requests} requests, {time.monotonic() - start:.0f}s, "
                             f"RSS {report.rss_kb_samples[-1] / 1024:.0f} MiB")
            report.duration_s = time.monotonic() - start - quiet_s * len(report.rss_kb_samples)
            report.memory_end = memory(server.process_group_pids())
            report.rss_kb_end = total(report.memory_end, "rss")
            report.pss_kb_end = total(report.memory_end, "pss")
            report.unique_kb_end = unique_kb(report.memory_end, stub_regions(server.process_group_pids()))
        finally:
            runner.close()
    finally:
        stopping = time.monotonic()
        server.stop()
        report.stop_s = time.monotonic() - stopping
        report.log = str(server.log_path) if server.log_path.exists() else ""
    report.processes_left = proc.group_members(pgid) if pgid else []
    report.regions_left = sorted(set(report.server_regions) & hostile.shm_regions())
    report.shm_regions_after = len(hostile.shm_regions())
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.reliability.soak", description=__doc__.splitlines()[0])
    parser.add_argument("repository", type=Path)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--hostile-fraction", type=float, default=0.1)
    parser.add_argument("--report", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    from tritonpack.cli import repository_entry
    from tritonpack.spec import mc

    ensemble, _ = repository_entry(args.repository)
    text = ensemble.input[0].data_type == mc.TYPE_STRING
    workload = text_workload(ensemble.name) if text else image_workload(ensemble.name)
    report = soak(args.repository, workload, args.requests, args.concurrency, args.hostile_fraction,
                  progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(report.summary())
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(report.to_json())
    return 0 if not (report.valid_failures or report.hostile_unexpected or report.processes_left
                     or report.regions_left) else 1


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
