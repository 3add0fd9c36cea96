"""Served bert side by side with its peers, in one run, on the same corpus.

Peers: sentence-transformers in-process (torch, OpenVINO, ONNX backends, batch 64; torch also at its default 32 and
on one thread) and infinity-emb served on loopback. In-process peers embed each workload in one `encode` call;
served sides (tritonpack and infinity-emb) get one sentence per request from c concurrent clients, c = 1, 4, 8, 16,
32. Throughput by concurrency on the mixed corpus, by length bucket at c=8 (torch's variants on the mixed corpus
only), p50/p99 latency; cosine to sentence-transformers torch.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from benchmarks import corpus, goals, peers
from benchmarks.meters import alternate, ratio_summary, side_summary
from benchmarks.sides import PeerWorker, SentenceTransformersSide, ServedSide, Side, cosine_min, served_tritonpack

REFERENCE = "st_torch_b64"
SERVED = "tritonpack"
GOAL_RATIOS = {"st_openvino_b64": goals.SERVED_OVER_ST_OPENVINO_C8, "infinity": goals.SERVED_OVER_SERVED_PEER_C8}
TORCH_BATCHES = ("st_torch_b64", "st_torch_b32")  # the torch goal holds against whichever is faster
FASTER_TORCH = "st_torch_faster_batch"
# the sides of the goals at c=8, in the order their runs sit side by side: faster torch batch, served, the rest
GOAL_SIDES = (*TORCH_BATCHES, SERVED, *GOAL_RATIOS)


def peer_env_ready(bench, env: peers.PeerEnv, skipped: dict) -> bool:
    root, mode = bench.peers_root, bench.settings.peers
    if mode == "none":
        skipped[env.name] = "left out: peers in their own venvs run in full mode (`make bench`) or with --peers"
        return False
    if env.ready(root):
        return True
    if mode != "all":
        skipped[env.name] = f"its venv ({env.folder(root)}) is not made; `make bench` makes it once (minutes)"
        return False
    bench.log(f"  making the {env.name} peer venv in {env.folder(root)} (first run only; minutes)")
    try:
        env.create(root, bench.out / "logs" / f"venv-{env.name}.log")
        return True
    except Exception as e:  # noqa: BLE001 - a peer that cannot be installed is reported, the others still run
        skipped[env.name] = f"venv creation failed ({type(e).__name__}: {e}); log: logs/venv-{env.name}.log"
        return False


def worker_side(bench, python: Path, backend: str, environment: str, export_dir: Path | None) -> Side:
    log = bench.out / "logs" / f"st-{backend}.log"
    worker = PeerWorker(python, backend, corpus.model_path(), export_dir, environment, log)
    return SentenceTransformersSide(worker, bench.settings.peer_batch_size)


def start_infinity(bench, engine: peers.InfinityEngine, texts: list[str], versions: dict) -> ServedSide:
    root, s = bench.peers_root, bench.settings
    log = bench.out / "logs" / f"infinity-{engine.name}.log"
    folder = peers.onnx_model_folder(root, corpus.model_path(), log) if engine.reads_onnx else corpus.model_path()
    server = peers.InfinityServer(root, engine, folder, log, s.peer_batch_size).start()
    side = ServedSide("infinity", f"served infinity-emb ({engine.name})",
                      lambda: peers.OpenAIEmbeddingsClient(server.port, peers.InfinityServer.MODEL_NAME),
                      {"server": f"infinity_emb v2, engine {engine.engine}", "engine": engine.name,
                       "batch_size": s.peer_batch_size, "versions": versions,
                       "client": "http.client keep-alive, POST /embeddings (OpenAI API)"}, stop=server.stop)
    try:
        side.run(texts[:32], 8)  # warm-up
    except BaseException:
        side.close()
        raise
    return side


def infinity_side(bench, texts: list[str], engines: list[peers.InfinityEngine],
                  floor_check: tuple[list[str], np.ndarray]) -> ServedSide:
    """infinity-emb with the first of `engines` that start here by `compared_first`: each is tried at c=8 on the
    corpus and embeds `floor_check`'s held-out sentences (within 256 tokens, sentence-transformers torch's vectors
    beside them)."""
    versions = {env: env.versions(bench.peers_root) for env in {engine.env for engine in engines}}
    tried: dict[str, dict] = {}
    started: list[ServedSide] = []
    try:
        for engine in engines:
            try:
                started.append(start_infinity(bench, engine, texts, versions[engine.env]))
                tried[engine.name] = {"started": True}
            except Exception as e:  # noqa: BLE001 - an engine that does not start is recorded; the next is tried
                tried[engine.name] = {"started": False, "error": f"{type(e).__name__}: {e}"}
        if not started:
            raise RuntimeError(f"no engine started: {tried}")
        if len(started) > 1:
            check_texts, check_vectors = floor_check
            for side in list(started):
                try:
                    tried[side.details["engine"]].update(
                        probe_c8_sentences_per_s=side.run(texts, goals.CONCURRENCY).per_second,
                        min_cosine_within_256=cosine_min(side.embed(check_texts), check_vectors))
                except Exception as e:  # noqa: BLE001 - an engine that fails its probe is recorded; the others run
                    tried[side.details["engine"]]["error"] = f"probe failed: {type(e).__name__}: {e}"
                    started.remove(side)
                    side.close()
            if not started:
                raise RuntimeError(f"every engine failed its probe: {tried}")
            order = compared_first(tried)
            started.sort(key=lambda side: order.index(side.details["engine"]))
            bench.log(f"  infinity-emb engines at c=8: {tried}")
    except BaseException:
        for side in started:
            side.close()
        raise
    for other in started[1:]:
        other.close()
    started[0].details["engines_tried"] = tried
    return started[0]


def compared_first(tried: dict[str, dict]) -> list[str]:
    """The engines probed, the one compared first: the fastest of those whose embeddings hold the cosine floor the
    served side holds (one computing in reduced precision may not), then the rest by speed."""
    probed = [name for name, t in tried.items() if "probe_c8_sentences_per_s" in t]
    return sorted(probed, key=lambda name: (not tried[name]["min_cosine_within_256"] >= goals.COSINE_MIN,
                                            -tried[name]["probe_c8_sentences_per_s"]))


def add_peer(sides: list[Side], skipped: dict, name: str, make) -> None:
    """Add the side `make()` returns; a peer that fails to start is reported, the others still run."""
    try:
        sides.append(make())
    except Exception as e:  # noqa: BLE001 - recorded in the report
        skipped[name] = f"did not start: {type(e).__name__}: {e}"


def make_sides(bench, server, texts: list[str], held_out: list[corpus.Sentence],
               sides: list[Side]) -> tuple[dict[str, str], np.ndarray]:
    """Fill `sides` (the caller closes them, also when this fails); returns the peers left out and why, and the
    reference's (sentence-transformers torch's) embeddings of `held_out`, which infinity-emb's engines are checked
    against."""
    s, skipped, root = bench.settings, {}, bench.peers_root
    torch_side = worker_side(bench, Path(sys.executable), "torch", ".venv", None)
    sides.append(torch_side)
    reference = torch_side.embed([x.text for x in held_out])
    if s.st_variants:  # torch's default batch; one thread, which other processes' load hurts less
        sides += [torch_side.variant(32), torch_side.variant(s.peer_batch_size, torch_threads=1)]
    if peer_env_ready(bench, peers.ST_OPENVINO, skipped):
        add_peer(sides, skipped, "st-openvino", lambda: worker_side(
            bench, peers.ST_OPENVINO.python(root), "openvino", f"venv {peers.ST_OPENVINO.name}",
            peers.ST_OPENVINO.folder(root) / "exports" / "openvino"))
    if peer_env_ready(bench, peers.INFINITY, skipped):
        add_peer(sides, skipped, "st-onnx", lambda: worker_side(
            bench, peers.INFINITY.python(root), "onnx", f"venv {peers.INFINITY.name}",
            peers.INFINITY.folder(root) / "exports" / "onnx"))
        engines = [peers.INFINITY_ENGINES[name] for name in s.infinity_engines]
        engines = [engine for engine in engines if peer_env_ready(bench, engine.env, skipped)]
        within = [i for i, x in enumerate(held_out) if x.tokens <= corpus.MAX_TOKENS]  # infinity-emb truncates at 512
        add_peer(sides, skipped, "infinity", lambda: infinity_side(
            bench, texts, engines, ([held_out[i].text for i in within], reference[within])))
    sides.append(served_tritonpack(server, bench.served_repository))
    return skipped, reference


def cosines(sides: list[Side], held_out: list[corpus.Sentence], reference: np.ndarray) -> dict:
    """Min cosine of each side's embeddings to sentence-transformers torch's (`reference`), within 256 tokens and
    beyond."""
    texts = [x.text for x in held_out]
    truncated = np.array([x.tokens > corpus.MAX_TOKENS for x in held_out])
    vectors = {side.key: reference if side.key == REFERENCE else side.embed(texts) for side in sides}
    out = {}
    for key, v in vectors.items():
        within = cosine_min(v[~truncated], reference[~truncated])
        beyond = cosine_min(v[truncated], reference[truncated]) if truncated.any() else None
        out[key] = {"within_256_tokens": within, "beyond_256_tokens": beyond,
                    "min": min(x for x in (within, beyond) if x is not None)}
    return out


def task_name(side: Side, c: int | None) -> str:
    """`tritonpack c=8` in the by-concurrency runs; the side's key alone where each side runs at one setting."""
    return f"{side.key} c={c}" if side.served and c is not None else side.key


def tasks(sides: list[Side], texts: list[str], concurrencies, named_by_c: bool = True) -> dict:
    """Every side's run at every concurrency it takes, in the order `alternate` runs them: served c=8 next to the
    peers its goals compare it with (`goals_side_by_side`)."""
    out = {}
    for side in sides:
        for c in concurrencies if side.served else (1,):
            out[task_name(side, c if named_by_c else None)] = lambda side=side, c=c: side.run(texts, c)
    goal_c = goals.CONCURRENCY if named_by_c else None
    goal_runs = [task_name(side, goal_c) for key in GOAL_SIDES for side in sides if side.key == key]
    return goals_side_by_side(out, goal_runs)


def goals_side_by_side(named: dict, goal_runs: list[str]) -> dict:
    """`named` reordered so that the goals' runs (those of `goal_runs` it has) sit together in the middle, which
    `alternate` keeps together when it reverses the order. A 2-vCPU VM's throughput drifts within seconds (ten served
    runs a second apart: 120-155 sentences/s at the same batch of ~3.5, docs/performance.md, fifty-first round), so a
    goal's ratio pairs runs seconds apart rather than a minute."""
    goal = [name for name in goal_runs if name in named]
    rest = [name for name in named if name not in goal]
    order = rest[:len(rest) // 2] + goal + rest[len(rest) // 2:]
    return {name: named[name] for name in order}


def ratios(runs: dict, sides: list[Side], c: int | None) -> dict:
    """Served tritonpack ÷ every other side measured (in-process peers at their batch, served peers at the same c);
    with the goals at c=8."""
    ours = next(side for side in sides if side.key == SERVED)
    at_goal = c == goals.CONCURRENCY
    out = {}
    for side in sides:
        theirs = runs.get(task_name(side, c))
        if side is ours or theirs is None:  # a variant is measured on the mixed corpus only
            continue
        out[side.key] = ratio_summary(runs[task_name(ours, c)], theirs, GOAL_RATIOS.get(side.key) if at_goal else None)
    torch_runs = [runs[key] for key in TORCH_BATCHES if key in runs]
    if at_goal and torch_runs:  # in each repetition, the faster of torch's batches that ran
        faster = [max(repetition, key=lambda run: run.per_second) for repetition in zip(*torch_runs)]
        out[FASTER_TORCH] = ratio_summary(runs[task_name(ours, c)], faster, goals.SERVED_OVER_ST_TORCH_C8)
    return out


def summaries(runs: dict) -> dict:
    return {name: side_summary(r) for name, r in runs.items()}


def measure(bench, server) -> dict:
    s = bench.settings
    timed = corpus.corpus(s.sentences, s.seed)
    texts = [x.text for x in timed]
    held_out = corpus.held_out(s.held_out, s.seed, timed)
    sides: list[Side] = []
    try:
        skipped, reference = make_sides(bench, server, texts, held_out, sides)
        bench.log("peers: cosine to sentence-transformers torch on held-out sentences")
        cos = cosines(sides, held_out, reference)
        for side in sides:  # warm every side (arenas, kernels, connections) at the most clients any run uses
            side.run(texts[:64], max(*s.concurrencies, s.bucket_concurrency))
        bench.log("peers side by side, mixed corpus, by concurrency")
        by_c = alternate(tasks(sides, texts, s.concurrencies), s.repetitions, bench.log)
        by_bucket = {}
        for name, group in corpus.by_bucket(timed).items():
            bench.log(f"peers side by side, {name} tokens ({len(group)} sentences), c={s.bucket_concurrency}")
            by_bucket[name] = alternate(tasks([x for x in sides if not x.is_variant], [x.text for x in group],
                                              (s.bucket_concurrency,), named_by_c=False), s.repetitions, bench.log)
    finally:
        for side in sides:
            side.close()
    return {
        "how": "in-process sides: one encode call over the workload at their batch size; served sides: c clients, "
               "one sentence per request",
        "sides": {side.key: side.describe() for side in sides}, "skipped": skipped,
        "corpus": corpus.describe(timed), "cosine_to_st_torch": cos,
        "by_concurrency": summaries(by_c),
        "ratios_by_concurrency": {str(c): ratios(by_c, sides, c) for c in s.concurrencies},
        "by_bucket": {name: summaries(runs) for name, runs in by_bucket.items()},
        "ratios_by_bucket": {name: ratios(runs, sides, None) for name, runs in by_bucket.items()},
        "bucket_concurrency": s.bucket_concurrency,
    }
