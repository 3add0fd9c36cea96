"""Cold start, memory per loaded model and sizes, through the local multi-model endpoint (`tritonpack.mme.LocalMME`:
gateway → Triton's SageMaker front-end), as SageMaker's MME would load the bert tarball.

- Cold start: a fresh endpoint (tritonserver already up, empty disk cache) → the first invocation of the tarball
  answered: extraction, `POST /models`, the python stubs starting, the first request.
- Memory: copies of the tarball under different names in one models folder; 1, 4 and 8 of them loaded (each invoked
  once, then a few hundred requests spread over the loaded copies, then every word of the vocabulary once to each
  copy loaded in that step, as an endpoint's varied traffic reads its embedding table over time), then the PSS of
  tritonserver and all its stubs summed once the models are idle (IDLE_WAIT_S after their last request, when they
  have released what they hold only for their next call; also taken 3 s after it, and idle before the vocabulary,
  as most models an MME keeps loaded are at a given moment): each page the group maps is counted
  once, however many of its processes share it (the python backend's /dev/shm regions are mapped by tritonserver
  and by a stub; libraries by every stub). Library pages also mapped by processes outside the group (another Python
  using the same .venv) are charged partly to those, so the sum is a little lower on a busy machine than in a
  container of its own. The gateway runs in the bench process and is not counted, as SageMaker's platform is not in
  the container.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks import corpus, goals
from tritonpack import proc

# the goals' units: MB of 10^6 bytes (`proc.KB_PER_MB`); reports before 2026-11-26 showed MiB as MB
BYTES_PER_MB = 1e6
# past models/shared/resident_memory.PAGES_IDLE_S (10 s): the python models have handed back their freed heap and
# unmapped the library pages their calls mapped (reports before 2026-11-29 measured 3 s after, heap returned only)
IDLE_WAIT_S = 11.5


def copies(tarball: Path, folder: Path, n: int) -> list[str]:
    """`n` targets in `folder`: the tarball and n-1 copies under other names (hard links where possible)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    names = [tarball.name] + [tarball.name.replace(".tar.gz", f"-copy{i}.tar.gz") for i in range(2, n + 1)]
    for name in names:
        try:
            os.link(tarball, folder / name)
        except OSError:
            shutil.copy2(tarball, folder / name)
    return names


def invoke(url: str, target: str, text: str) -> float:
    from tritonpack.mme.container import TARGET_HEADER
    from tritonpack.payloads import text_payload

    payload = text_payload([text], "json")
    request = urllib.request.Request(f"{url}/endpoints/bench/invocations", data=payload.body, method="POST",
                                     headers={"Content-Type": payload.content_type,
                                              TARGET_HEADER: target})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=300) as response:
        json.loads(response.read())
    return time.perf_counter() - start


def group_memory(server) -> dict:
    """Summed PSS and RSS of tritonserver and its stubs (MB), and PSS by process kind."""
    memory = proc.memory_by_process(server.process_group_pids())
    kinds: dict[str, dict] = {}
    for name, m in memory.items():
        kind = kinds.setdefault(name.rsplit("[", 1)[0], {"processes": 0, "pss_mb": 0.0})
        kind["processes"] += 1
        kind["pss_mb"] += m.pss / proc.KB_PER_MB
    def summed_mb(field: str) -> float:
        return sum(getattr(m, field) for m in memory.values()) / proc.KB_PER_MB

    return {"pss_mb": summed_mb("pss"), "rss_mb": summed_mb("rss"), "private_mb": summed_mb("private"),
            "processes": len(memory), "by_kind": kinds}


def settle(server, quiet_s: float = 3.0, timeout_s: float = 120.0) -> None:
    """Wait until the server's process group stops changing (stubs replaced by a reload take seconds to exit)."""
    deadline = time.monotonic() + timeout_s
    members, since = set(server.process_group_pids()), time.monotonic()
    while time.monotonic() - since < quiet_s and time.monotonic() < deadline:
        time.sleep(0.5)
        now = set(server.process_group_pids())
        if now != members:
            members, since = now, time.monotonic()


def idle_memory(server, last_request: float) -> dict:
    """group_memory once the group has settled and IDLE_WAIT_S have passed since `last_request` (time.monotonic)."""
    settle(server)
    time.sleep(max(0.0, last_request + IDLE_WAIT_S - time.monotonic()))
    return group_memory(server)


def available_mb() -> float:
    return proc.available_kb() / proc.KB_PER_MB


def serve(url: str, work: list[tuple[str, str]]) -> None:
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda item: invoke(url, *item), work))


def loaded_ladder(bench, mme, targets: list[str], texts: list[str], vocabulary: list[str]) -> dict:
    """Load the targets in steps (1, 4, 8 …; the first is loaded already), serve the corpus, let the group settle,
    measure; then the vocabulary to each copy loaded in that step, settle, measure again (the step's figure).
    `stub_processes_started` counts every stub pid seen: one per python step of each copy (the default bert has one),
    and as many more for each copy Triton reloads while loading the next (copies share step names; a copy whose stubs
    wrote bytecode into its folders is reloaded once, docs/performance.md, sixteenth round), when memory briefly holds
    one copy more; the ladder stops before copy k where the machine has less than k copies' memory free (a wide
    margin)."""
    s, server, metrics = bench.settings, mme.triton.server, mme.manager.metrics
    steps, first_answer_s, check_s, loaded, stopped = {}, {targets[0]: None}, {}, 1, None
    for n in s.loaded_copies:
        for k, target in enumerate(targets[loaded:n], start=loaded + 1):
            per_model = steps[str(loaded)]["pss_mb"] / loaded if steps else 600.0
            if available_mb() < k * per_model:
                stopped = f"stopped before loading copy {k}: {available_mb():.0f} MB available, ~{per_model:.0f} MB " \
                          "per loaded copy"
                break
            checked = metrics.snapshot()["ModelCheckingTime_sum"]
            first_answer_s[target] = invoke(mme.url, target, texts[0])
            check_s[target] = metrics.snapshot()["ModelCheckingTime_sum"] - checked
            server.stub_models()  # remember the stub pids, before a reload replaces them
        if stopped:
            break
        serve(mme.url, [(targets[i % n], texts[i % len(texts)]) for i in range(s.requests_per_step)])
        corpus_only = idle_memory(server, time.monotonic())["pss_mb"]
        newly_loaded = targets[loaded:n] if steps else targets[:n]
        serve(mme.url, [(target, text) for target in newly_loaded for text in vocabulary])
        served = time.monotonic()
        settle(server)
        recently_served = group_memory(server)
        loaded = n
        steps[str(n)] = idle_memory(server, served) | {
            "before_vocabulary_pss_mb": corpus_only, "recently_served_pss_mb": recently_served["pss_mb"],
            "recently_served_by_kind": recently_served["by_kind"], "stub_processes_started": len(server.stub_models())}
        step = steps[str(n)]
        bench.log(f"    {n} loaded, idle: PSS {step['pss_mb']:.0f} MB ({recently_served['pss_mb']:.0f} 3 s after the "
                  f"last request, {corpus_only:.0f} before the vocabulary; RSS summed {step['rss_mb']:.0f} MB)")
    # the copies carry the first's packed environment, which the gateway's check inflates once (KnownEnvs)
    return {"steps": steps, "first_answer_s_by_target": first_answer_s, "check_s_by_target": check_s,
            "environments_inflated": mme.manager.store.known_envs.inspected, "stopped": stopped,
            "requests_per_step": s.requests_per_step, "idle_wait_s": IDLE_WAIT_S,
            "vocabulary_words": sum(len(t.split()) for t in vocabulary)}


def summarize_memory(server_only: dict, ladder: dict) -> dict:
    steps = ladder["steps"]
    counts = sorted(int(n) for n in steps)
    one, most = steps[str(counts[0])]["pss_mb"], steps[str(counts[-1])]["pss_mb"]
    per_additional = (most - one) / (counts[-1] - counts[0]) if counts[-1] > counts[0] else None
    return {"server_only": server_only, **ladder,
            "one_model_total_pss_mb": one, "first_model_pss_mb": one - server_only["pss_mb"],
            "one_model_before_vocabulary_pss_mb": steps[str(counts[0])]["before_vocabulary_pss_mb"],
            "one_model_recently_served_pss_mb": steps[str(counts[0])]["recently_served_pss_mb"],
            "per_additional_model_pss_mb": per_additional,
            "models_per_gb": 1000 / per_additional if per_additional else None,
            "target_one_model_mb": goals.ONE_MODEL_PSS_MB, "met": one <= goals.ONE_MODEL_PSS_MB}


def load_phases(mme) -> dict:
    """Where the local MME's first load went, from its metrics: the gateway (the wait less Triton's part), and of it
    fetching, `check` (whose read also unpacks the tarball) and placing it, then Triton's load (environment, stubs,
    `initialize`)."""
    metrics = mme.manager.metrics.snapshot()
    triton = metrics["ModelLoadingTime_sum"]
    return {"gateway_s": metrics["ModelLoadingWaitTime_sum"] - triton, "fetch_s": metrics["ModelDownloadingTime_sum"],
            "check_s": metrics["ModelCheckingTime_sum"], "extract_s": metrics["ModelExtractingTime_sum"],
            "triton_load_s": triton}


def measure(bench, tarball: Path, container_python: str | None = None) -> dict:
    """Cold starts under the container environment `tritonpack deploy` sets, alternating with a stock endpoint's
    (nothing set: auto-complete on), and memory through the first; the stub of `container_python` where given
    (`tritonpack mme --container-python`), else this interpreter's."""
    from tritonpack.containers import ADDITIONAL_ARGS, CONTAINER_ENVIRONMENT
    from tritonpack.mme import LocalMME
    from tritonpack.server import PYTHON_VERSION

    s = bench.settings
    texts = [x.text for x in corpus.corpus(64, s.seed)]
    folder = bench.out / "mme-models"
    targets = copies(tarball, folder, max(s.loaded_copies))
    environments = {"tritonpack": dict(CONTAINER_ENVIRONMENT), "stock": {**CONTAINER_ENVIRONMENT, ADDITIONAL_ARGS: ""}}
    cold: dict[str, list] = {name: [] for name in environments}
    memory = None
    for rep in range(s.cold_starts):
        for name, environment in environments.items():
            with tempfile.TemporaryDirectory(prefix="benchmarks-mme-") as cache:
                mme = LocalMME(str(folder), port=0, cache_dir=Path(cache), max_models=len(targets),
                               triton_log=bench.out / "logs" / f"mme-{name}-{rep}.log", environment=environment,
                               container_python=container_python)
                started = time.perf_counter()
                with mme:
                    server_start = time.perf_counter() - started
                    server_only = group_memory(mme.triton.server) if memory is None else None
                    first = invoke(mme.url, targets[0], texts[0])
                    phases = load_phases(mme)
                    warm = invoke(mme.url, targets[0], texts[1])
                    cold[name].append({"server_start_s": server_start, "first_answer_s": first, "warm_answer_s": warm,
                                       **phases})
                    bench.log(f"    cold start {rep + 1}, {name} environment: tarball → first answer {first:.2f}s "
                              f"(gateway {phases['gateway_s']:.2f}s: check and unpacking {phases['check_s']:.2f}s, "
                              f"placing {phases['extract_s']:.2f}s; Triton's load {phases['triton_load_s']:.2f}s; "
                              f"server start {server_start:.1f}s, warm {1000 * warm:.0f} ms)")
                    if memory is None:
                        memory = summarize_memory(server_only, loaded_ladder(bench, mme, targets, texts,
                                                                             corpus.vocabulary_texts()))
    shutil.rmtree(folder, ignore_errors=True)
    first = statistics.median(r["first_answer_s"] for r in cold["tritonpack"])
    return {
        "via": "tritonpack.mme.LocalMME (gateway → Triton 2.51 SageMaker front-end)", "tarball": str(tarball),
        "stub_python": container_python or PYTHON_VERSION, "container_python": container_python is not None,
        "container_environment": environments["tritonpack"],
        "cold_start": {"first_answer_s_median": first, "runs": cold["tritonpack"], "target_s": goals.COLD_START_S,
                       "met": first <= goals.COLD_START_S,
                       "stock_endpoint": {"first_answer_s_median": statistics.median(
                           r["first_answer_s"] for r in cold["stock"]), "runs": cold["stock"]}},
        "memory": memory,
    }


def tarball_size(tarball: Path) -> dict:
    tarball_mb = tarball.stat().st_size / BYTES_PER_MB
    return {"tarball": tarball.name, "tarball_mb": tarball_mb, "tarball_target_mb": goals.TARBALL_MB,
            "tarball_met": tarball_mb <= goals.TARBALL_MB}


def sizes(bench, tarball: Path) -> dict:
    """The bert tarball and the packed environments in dist/envs (made by `make env`)."""
    envs_dir = Path(bench.settings.dist) / "envs"
    envs = {str(p.relative_to(envs_dir)): p.stat().st_size for p in sorted(envs_dir.rglob("*"))
            if p.is_file() and p.name.endswith((".tar.gz", ".tgz", ".tar"))} if envs_dir.is_dir() else {}
    text_envs = [size for name, size in envs.items() if "text" in name]
    text_env_mb = max(text_envs) / BYTES_PER_MB if text_envs else None
    return {**tarball_size(tarball), "envs_bytes": envs,
            "envs_note": None if envs else f"{envs_dir} has no packed environments (run `make env`)",
            "text_env_mb": text_env_mb, "text_env_target_mb": goals.TEXT_ENV_MB,
            "text_env_met": text_env_mb is not None and text_env_mb <= goals.TEXT_ENV_MB}
