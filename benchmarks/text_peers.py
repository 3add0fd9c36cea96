"""Served bert side by side with its peers, in one run, on the same corpus.

Peers: sentence-transformers in-process (torch, OpenVINO, ONNX backends, batch 64; torch also at its default 32) and
infinity-emb served on loopback. In-process peers embed each workload in one `encode` call; served sides (tritonpack
and infinity-emb) get one sentence per request from c concurrent clients, c = 1, 4, 8, 16, 32. Throughput by
concurrency on the mixed corpus, by length bucket at c=8, p50/p99 latency; cosine to sentence-transformers torch.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from benchmarks import corpus, goals, peers
from benchmarks.meters import alternate, ratio_summary, side_summary
from benchmarks.sides import PeerWorker, SentenceTransformersSide, ServedSide, Side, cosine_min, served_tritonpack

REFERENCE = "st_torch_b64"
GOAL_RATIOS = {"st_openvino_b64": goals.SERVED_OVER_ST_OPENVINO_C8, "st_torch_b64": goals.SERVED_OVER_ST_TORCH_C8,
               "infinity": goals.SERVED_OVER_SERVED_PEER_C8}


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


def infinity_side(bench, texts: list[str], skipped: dict) -> ServedSide | None:
    """infinity-emb with the fastest of its CPU engines that start here (each tried at c=8 on the corpus)."""
    root, s = bench.peers_root, bench.settings
    log = bench.out / "logs" / "infinity.log"
    versions = peers.INFINITY.versions(root)
    tried: dict[str, dict] = {}
    started: list[ServedSide] = []
    for engine in s.infinity_engines:
        try:
            folder = peers.onnx_model_folder(root, corpus.model_path(), log) if engine == "optimum" \
                else corpus.model_path()
            server = peers.InfinityServer(root, engine, folder, log, s.peer_batch_size).start()
        except Exception as e:  # noqa: BLE001 - an engine that does not start is recorded; the next is tried
            tried[engine] = {"started": False, "error": f"{type(e).__name__}: {e}"}
            continue
        side = ServedSide("infinity", f"served infinity-emb ({engine})",
                          lambda port=server.port: peers.OpenAIEmbeddingsClient(port, peers.InfinityServer.MODEL_NAME),
                          {"server": f"infinity_emb v2, engine {engine}", "engine": engine,
                           "batch_size": s.peer_batch_size, "versions": versions,
                           "client": "http.client keep-alive, POST /embeddings (OpenAI API)"}, stop=server.stop)
        side.run(texts[:32], 8)  # warm-up
        tried[engine] = {"started": True}
        started.append(side)
    if not started:
        skipped["infinity"] = f"no engine started: {tried}"
        return None
    if len(started) > 1:
        for side in started:
            tried[side.details["engine"]]["probe_c8_sentences_per_s"] = side.run(texts, 8).per_second
        started.sort(key=lambda side: -tried[side.details["engine"]]["probe_c8_sentences_per_s"])
        bench.log(f"  infinity-emb engines at c=8: {tried}")
    for slower in started[1:]:
        slower.close()
    started[0].details["engines_tried"] = tried
    return started[0]


def make_sides(bench, server, texts: list[str]) -> tuple[list[Side], dict[str, str]]:
    s, skipped = bench.settings, {}
    torch_side = worker_side(bench, Path(sys.executable), "torch", ".venv", None)
    sides: list[Side] = [torch_side]
    if s.st_variants:  # torch's default batch; one thread, which other processes' load hurts less (README)
        sides += [torch_side.variant(32), torch_side.variant(s.peer_batch_size, torch_threads=1)]
    root = bench.peers_root
    if peer_env_ready(bench, peers.ST_OPENVINO, skipped):
        sides.append(worker_side(bench, peers.ST_OPENVINO.python(root), "openvino", f"venv {peers.ST_OPENVINO.name}",
                                 peers.ST_OPENVINO.folder(root) / "exports" / "openvino"))
    if peer_env_ready(bench, peers.INFINITY, skipped):
        sides.append(worker_side(bench, peers.INFINITY.python(root), "onnx", f"venv {peers.INFINITY.name}",
                                 peers.INFINITY.folder(root) / "exports" / "onnx"))
        if (side := infinity_side(bench, texts, skipped)) is not None:
            sides.append(side)
    sides.append(served_tritonpack(server, bench.served_repository))
    return sides, skipped


def cosines(sides: list[Side], held_out: list[corpus.Sentence]) -> dict:
    """Min cosine of each side's embeddings to sentence-transformers torch, within 256 tokens and beyond."""
    texts = [x.text for x in held_out]
    truncated = np.array([x.tokens > corpus.MAX_TOKENS for x in held_out])
    vectors = {side.key: side.embed(texts) for side in sides}
    reference = vectors[REFERENCE]
    out = {}
    for key, v in vectors.items():
        within = cosine_min(v[~truncated], reference[~truncated])
        beyond = cosine_min(v[truncated], reference[truncated]) if truncated.any() else None
        out[key] = {"within_256_tokens": within, "beyond_256_tokens": beyond,
                    "min": min(x for x in (within, beyond) if x is not None)}
    return out


def tasks(sides: list[Side], texts: list[str], concurrencies) -> dict:
    out = {}
    for side in sides:
        if side.served:
            for c in concurrencies:
                out[f"{side.key} c={c}"] = lambda side=side, c=c: side.run(texts, c)
        else:
            out[side.key] = lambda side=side: side.run(texts)
    return out


def ratios(runs: dict, sides: list[Side], served_key: str, c: int, with_goals: bool = True) -> dict:
    """served tritonpack at c ÷ every other side (in-process peers at their batch, served peers at the same c)."""
    ours = runs[f"{served_key} c={c}"]
    out = {}
    for side in sides:
        if side.key == served_key:
            continue
        theirs = runs[f"{side.key} c={c}"] if side.served else runs[side.key]
        out[side.key] = ratio_summary(ours, theirs, GOAL_RATIOS.get(side.key) if with_goals and c == 8 else None)
    return out


def summaries(runs: dict) -> dict:
    return {name: side_summary(r) for name, r in runs.items()}


def measure(bench, server) -> dict:
    s = bench.settings
    timed = corpus.corpus(s.sentences, s.seed)
    texts = [x.text for x in timed]
    sides, skipped = make_sides(bench, server, texts)
    try:
        bench.log("peers: cosine to sentence-transformers torch on held-out sentences")
        cos = cosines(sides, corpus.held_out(s.held_out, s.seed))
        for side in sides:  # warm every side (arenas, kernels, connections)
            side.run(texts[:64], max(s.concurrencies))
        bench.log("peers side by side, mixed corpus, by concurrency")
        by_c = alternate(tasks(sides, texts, s.concurrencies), s.repetitions, bench.log)
        by_bucket = {}
        for name, group in corpus.by_bucket(timed).items():
            bench.log(f"peers side by side, {name} tokens ({len(group)} sentences), c={s.bucket_concurrency}")
            by_bucket[name] = alternate(tasks(sides, [x.text for x in group], (s.bucket_concurrency,)),
                                        s.repetitions, bench.log)
    finally:
        for side in sides:
            side.close()
    served = "tritonpack"
    return {
        "how": "in-process sides: one encode call over the workload at their batch size; served sides: c clients, "
               "one sentence per request",
        "sides": {side.key: side.describe() for side in sides}, "skipped": skipped,
        "corpus": corpus.describe(timed), "cosine_to_st_torch": cos,
        "by_concurrency": summaries(by_c),
        "ratios_by_concurrency": {str(c): ratios(by_c, sides, served, c) for c in s.concurrencies},
        "by_bucket": {name: summaries(runs) for name, runs in by_bucket.items()},
        "ratios_by_bucket": {name: ratios(runs, sides, served, s.bucket_concurrency, with_goals=False)
                             for name, runs in by_bucket.items()},
        "bucket_concurrency": s.bucket_concurrency,
    }
